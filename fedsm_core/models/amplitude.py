"""HarmoFL's amplitude normalization (Jiang et al., AAAI 2022), as a model input layer.

Scanners and cameras differ mostly in low-level appearance (colour, contrast,
brightness), which lives in the amplitude of an image's Fourier transform;
anatomy lives in its phase. The layer replaces each image's amplitude by an
average amplitude and keeps the image's own phase:

    F = FFT2(x),  x' = IFFT2(A_avg * exp(i * angle(F)))          (per channel)

In training, the average follows the batches of the site:

    A_k = (1 - v) * A_{k-1} + v * mean_batch |F|,   A_0 = 0

and after the first round the server averages the sites' amplitudes into one
global amplitude that every site then uses, fixed (``freeze``). Only this
average amplitude leaves a site, never an image. ``window`` limits the
replacement to the lowest frequencies: 0 replaces the whole spectrum, ``w``
replaces frequencies with ``|u| < w`` and ``|v| < w`` (``w = 1``: only the DC
term, as one public implementation does).
"""

from __future__ import annotations

import torch
import torch.nn as nn


def low_frequency_mask(height: int, width: int, window: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean ``[H, W]`` mask of the frequencies ``window`` replaces (all for 0)."""
    if window < 0:
        raise ValueError(f"amplitude window = {window} must be >= 0 (0 = whole spectrum)")
    if window == 0:
        return torch.ones(height, width, dtype=torch.bool, device=device)
    u = torch.fft.fftfreq(height, d=1.0 / height, device=device).abs()
    v = torch.fft.fftfreq(width, d=1.0 / width, device=device).abs()
    return (u[:, None] < window) & (v[None, :] < window)


def replace_amplitude(images: torch.Tensor, amplitude: torch.Tensor, window: int = 0) -> torch.Tensor:
    """Images ``[B, C, H, W]`` rebuilt from ``amplitude`` ``[C, H, W]`` and their own phase."""
    spectrum = torch.fft.fft2(images.to(torch.float32 if images.dtype != torch.float64 else images.dtype))
    mask = low_frequency_mask(images.shape[-2], images.shape[-1], window, images.device)
    target = torch.where(mask, amplitude.to(spectrum.real.dtype), spectrum.abs())
    rebuilt = torch.polar(target, torch.angle(spectrum))
    return torch.fft.ifft2(rebuilt).real.to(images.dtype)


class AmplitudeNormalization(nn.Module):
    """Input layer that gives every image the site's (or federation's) average amplitude.

    Parameters
    ----------
    channels : int
        Image channels.
    decay : float
        ``v`` of the running average, in ``(0, 1]``.
    window : int
        Low-frequency window to replace; 0 = whole spectrum.

    Notes
    -----
    The amplitude buffer is created at the first batch (its size is the
    image size) and then travels with the model weights. Until a batch has
    been seen the layer passes images through unchanged.
    """

    def __init__(self, channels: int = 3, decay: float = 0.1, window: int = 0) -> None:
        super().__init__()
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"amplitude decay v = {decay} must be in (0, 1]")
        if window < 0:
            raise ValueError(f"amplitude window = {window} must be >= 0")
        self.channels, self.decay, self.window = channels, float(decay), int(window)
        self.register_buffer("amplitude", torch.zeros(0))
        self.register_buffer("frozen", torch.zeros((), dtype=torch.bool))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    def freeze(self, amplitude: torch.Tensor) -> None:
        """Use ``amplitude`` ``[C, H, W]`` from now on without updating it (the global amplitude)."""
        self.amplitude = amplitude.detach().clone().to(self.frozen.device)
        self.frozen.fill_(True)

    @torch.no_grad()
    def update(self, images: torch.Tensor) -> None:
        """``A <- (1 - v) A + v * mean over the batch of |FFT2(images)|``."""
        mean_amplitude = torch.fft.fft2(images.float()).abs().mean(dim=0)
        if self.amplitude.numel() == 0:
            self.amplitude = torch.zeros_like(mean_amplitude)
        elif self.amplitude.shape != mean_amplitude.shape:
            raise ValueError(f"amplitude is {tuple(self.amplitude.shape[-2:])} but images are "
                             f"{tuple(images.shape[-2:])}; all images of a run must share one size")
        self.amplitude.mul_(1.0 - self.decay).add_(self.decay * mean_amplitude)
        self.batches += 1

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Normalized images; in training mode (and not frozen) the average is updated first."""
        if images.shape[1] != self.channels:
            raise ValueError(f"AmplitudeNormalization expects {self.channels} channels, got {images.shape[1]}")
        if self.training and not bool(self.frozen):
            self.update(images)
        if self.amplitude.numel() == 0:
            return images
        if self.amplitude.shape[-2:] != images.shape[-2:]:
            raise ValueError(f"amplitude is {tuple(self.amplitude.shape[-2:])} but images are "
                             f"{tuple(images.shape[-2:])}; all images of a run must share one size")
        return replace_amplitude(images, self.amplitude, self.window)
