"""Per-image standardization of a segmentation network's input: each image's channels to zero mean, unit variance.

Sites differ mostly in acquisition style: brightness, contrast and colour
gains (``fedsm_core/data/style.py`` draws them per image for the generated
sites). Centralized training sees every style in one batch and learns filters
that ignore them; a FedAvg site sees only its own and pulls the first layers
toward it. Standardizing each channel of each image,

    x'_c = (x_c - mean(x_c)) / sqrt(var(x_c) + eps)        (over the image's pixels)

removes a brightness offset, a contrast scale and a per-channel colour gain
exactly, before any weight sees them. The layer has no parameters and no state:
nothing about it is trained or sent, and every party that builds the model
from its :class:`~fedsm_core.models.spec.ModelSpec` applies it, so saved models
and ``fedsm predict`` standardize the same way. FedSM's selector does not get
it: telling the sites' styles apart is its job.
"""

from __future__ import annotations

import torch
import torch.nn as nn

INPUT_NORMS = ("none", "per-image")
EPS = 1e-6


def standardize_images(images: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``[B, C, H, W]`` images with every channel of every image at mean 0 and variance ``var / (var + eps)``.

    A constant channel becomes zeros.
    """
    mean = images.mean(dim=(2, 3), keepdim=True)
    var = images.var(dim=(2, 3), keepdim=True, unbiased=False)
    return (images - mean) / torch.sqrt(var + eps)


class InputStandardized(nn.Module):
    """A segmentation network that standardizes each image first (:func:`standardize_images`).

    Its weights are the network's under ``net.``; the layer adds none.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``net(standardize(images))``."""
        return self.net(standardize_images(images))
