"""Tiny stand-ins for a super model's parts, whose predictions are known from the images alone."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedsm_core.data.arrays import SegArrays


class ChannelSelector(nn.Module):
    """Logits are the first K pixels of channel 0 (so each image says how sure the selector is)."""

    def __init__(self, num_sites: int) -> None:
        super().__init__()
        self.num_sites = num_sites

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images[:, 0, 0, : self.num_sites] * 10


class Threshold(nn.Module):
    """Foreground where channel 1 exceeds ``level``: models of different quality on the same images."""

    def __init__(self, level: float) -> None:
        super().__init__()
        self.level = level

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images[:, 1:2] - self.level) * 50


class PixelHead(nn.Module):
    """Pixel-wise features then a 1x1 head named as kNN-Per looks for it, float64 so comparisons are exact."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Conv2d(3, 4, 1).double()
        self.segmentation_head = nn.Conv2d(4, 1, 1).double()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.segmentation_head(torch.tanh(self.body(images)))


class BrightnessSelector(nn.Module):
    """Two sites told apart by the mean of channel 0: dark images -> site 0, bright -> site 1."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        brightness = images[:, 0].mean(dim=(1, 2)) - 0.5
        return torch.stack([-20.0 * brightness, 20.0 * brightness], dim=1)


def tiny_site(seed: int, n: int = 12) -> SegArrays:
    """``n`` random 8x8 images of a site whose truth is channel 1 above 0.5."""
    rng = np.random.default_rng(seed)
    images = rng.random((n, 3, 8, 8)).astype(np.float32)
    masks = (images[:, 1:2] > 0.5).astype(np.float32)  # the truth: channel 1 above 0.5
    return SegArrays(images, masks, tuple(f"s{seed}/{i}" for i in range(n)))
