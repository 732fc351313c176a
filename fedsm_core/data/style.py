"""Random acquisition-style changes: the selector's site-contrast negatives, and a training augmentation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Smallest and largest log-factor of a style change: factors lie in
# [e^-0.25, e^-0.05] or [e^0.05, e^0.25] (about 0.78-0.95 or 1.05-1.28): far
# enough from 1 that a changed image never passes for an unchanged one, close
# enough that the negatives resemble other real sites rather than extremes.
MIN_LOG_CHANGE = 0.05
MAX_LOG_CHANGE = 0.25
BINOMIAL_KERNEL = (1.0, 4.0, 6.0, 4.0, 1.0)


def _factor(shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    magnitude = MIN_LOG_CHANGE + (MAX_LOG_CHANGE - MIN_LOG_CHANGE) * torch.rand(shape, generator=generator)
    sign = torch.where(torch.rand(shape, generator=generator) < 0.5, -1.0, 1.0)
    return torch.exp(sign * magnitude)


def _blur(images: torch.Tensor) -> torch.Tensor:
    channels = images.shape[1]
    kernel = torch.tensor(BINOMIAL_KERNEL, dtype=images.dtype, device=images.device)
    kernel = kernel / kernel.sum()
    row = kernel.view(1, 1, 1, -1).repeat(channels, 1, 1, 1)
    column = kernel.view(1, 1, -1, 1).repeat(channels, 1, 1, 1)
    blurred = F.conv2d(F.pad(images, (2, 2, 0, 0), mode="reflect"), row, groups=channels)
    return F.conv2d(F.pad(blurred, (0, 0, 2, 2), mode="reflect"), column, groups=channels)


def randomize_style(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Give each image a different random acquisition style; content is unchanged.

    Per image: gamma ``x^g``, contrast ``c`` and brightness ``b`` around the image
    mean ``m`` (``(x - m) c + m b``), per-channel colour gains, a 5x5 binomial blur
    with probability 1/2, and Gaussian noise with standard deviation up to 0.04.
    Every factor is at least ``e^0.05`` away from 1, so the result always looks
    acquired differently.

    Parameters
    ----------
    images : torch.Tensor
        ``[B, C, H, W]`` with values in ``[0, 1]``.
    generator : torch.Generator, optional
        Randomness source (CPU), for reproducible runs.

    Returns
    -------
    torch.Tensor
        Restyled images of the same shape, clipped to ``[0, 1]``.
    """
    if images.ndim != 4:
        raise ValueError(f"randomize_style: images must be [B, C, H, W], got shape {tuple(images.shape)}")
    batch, channels = images.shape[:2]
    device = images.device

    def draw(shape: tuple[int, ...]) -> torch.Tensor:
        return _factor(shape, generator).to(device)

    styled = images.clamp(1e-4, 1.0) ** draw((batch, 1, 1, 1))
    mean = styled.mean(dim=(1, 2, 3), keepdim=True)
    styled = (styled - mean) * draw((batch, 1, 1, 1)) + mean * draw((batch, 1, 1, 1))
    styled = styled * draw((batch, channels, 1, 1))
    blur = (torch.rand(batch, generator=generator) < 0.5).to(device)
    if blur.any():
        styled[blur] = _blur(styled[blur])
    noise_level = (0.04 * torch.rand((batch, 1, 1, 1), generator=generator)).to(device)
    noise = torch.randn(styled.shape, generator=generator).to(device)
    return (styled + noise * noise_level).clamp(0.0, 1.0)


def restyled_batch(probability: float, generator: torch.Generator | None = None):
    """A segmentation learner's batch function that restyles each image with ``probability``.

    ``style-augmentation``: a site that sees one acquisition style trains on
    others too (:func:`randomize_style`), so its update pulls less toward its
    own style. Masks are unchanged (a style change keeps the content), and the
    batch itself is not modified: other learners (FedSM's selector) step on the
    images as they are.
    """
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"style-augmentation = {probability} is outside [0, 1]")

    def batch(images: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = (torch.rand(len(images), generator=generator) < probability).to(images.device)
        if not chosen.any():
            return images, masks
        return torch.where(chosen[:, None, None, None], randomize_style(images, generator), images), masks

    return batch
