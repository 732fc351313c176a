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

Because ``A_0 = 0``, the running average of the first few batches is biased
toward zero (after ``t`` batches it holds ``1 - (1 - v)^t`` of the mean
amplitude), which would darken every image early in training. The layer
therefore normalizes with the bias-corrected average
``A_t / (1 - (1 - v)^t)``, as Adam corrects its moments; the running buffer
itself follows the formula above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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

    def __init__(self, channels: int = 3, decay: float = 0.1, window: int = 0, size: int = 0) -> None:
        super().__init__()
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"amplitude decay v = {decay} must be in (0, 1]")
        if window < 0:
            raise ValueError(f"amplitude window = {window} must be >= 0")
        if size < 0:
            raise ValueError(f"amplitude size = {size} must be >= 0 (0 = set by the first batch)")
        self.channels, self.decay, self.window = channels, float(decay), int(window)
        self.tracking = True
        # A known image size fixes the buffer's shape, so it travels with the weights from round 1.
        self.register_buffer("amplitude", torch.zeros(channels, size, size) if size else torch.zeros(0))
        # 0/1 as an integer, so averaging and serializing it works like any other buffer.
        self.register_buffer("frozen", torch.zeros((), dtype=torch.long))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    def freeze(self, amplitude: torch.Tensor) -> None:
        """Use ``amplitude`` ``[C, H, W]`` from now on without updating it (the global amplitude)."""
        self.amplitude = amplitude.detach().clone().to(self.frozen.device)
        self.frozen.fill_(1)

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

    def current(self) -> torch.Tensor:
        """The amplitude images get: the fixed one, or the bias-corrected running average."""
        if bool(self.frozen):
            return self.amplitude
        return bias_corrected(self.amplitude, int(self.batches), self.decay)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Normalized images; in training mode (and not frozen) the average is updated first."""
        if images.shape[1] != self.channels:
            raise ValueError(f"AmplitudeNormalization expects {self.channels} channels, got {images.shape[1]}")
        if self.training and self.tracking and not bool(self.frozen):
            self.update(images)
        if self.amplitude.numel() == 0 or (int(self.batches) == 0 and not bool(self.frozen)):
            return images
        if self.amplitude.shape[-2:] != images.shape[-2:]:
            raise ValueError(f"amplitude is {tuple(self.amplitude.shape[-2:])} but images are "
                             f"{tuple(images.shape[-2:])}; all images of a run must share one size")
        return replace_amplitude(images, self.current(), self.window)


class AmplitudeNormalized(nn.Module):
    """A segmentation network behind an amplitude normalization input layer.

    Used as every segmentation model of a run that sets
    ``amplitude-normalization``, so training, evaluation, saved models and
    ``fedsm predict`` all see normalized images, and the amplitude travels
    with the weights (``amplitude_norm.amplitude``).
    """

    def __init__(self, amplitude_norm: AmplitudeNormalization, net: nn.Module) -> None:
        super().__init__()
        self.amplitude_norm = amplitude_norm
        self.net = net

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``net(normalize(images))``."""
        return self.net(self.amplitude_norm(images))


def bias_corrected(amplitude: torch.Tensor, batches: int, decay: float) -> torch.Tensor:
    """``A_t / (1 - (1 - v)^t)``: the running average without its zero-start bias."""
    if batches <= 0:
        return amplitude
    return amplitude / (1.0 - (1.0 - decay) ** batches)


@contextlib.contextmanager
def frozen_statistics(model: nn.Module) -> Iterator[None]:
    """Within the block, forward passes update no running statistics.

    A second forward pass on the same batch (weight perturbation's gradient
    at ``w + delta``) must not count the batch twice: amplitude averages stop
    tracking and batch normalization uses momentum 0 (its running mean and
    variance stay put; it still normalizes with the batch's statistics).
    """
    saved: list[tuple[nn.Module, object]] = []
    for module in model.modules():
        if isinstance(module, AmplitudeNormalization):
            saved.append((module, module.tracking))
            module.tracking = False
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            saved.append((module, module.momentum))
            module.momentum = 0.0
    try:
        yield
    finally:
        for module, value in saved:
            if isinstance(module, AmplitudeNormalization):
                module.tracking = value
            else:
                module.momentum = value
