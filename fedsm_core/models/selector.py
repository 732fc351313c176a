"""The FedSM model selector: a compact VGG-11-style site classifier."""

from __future__ import annotations

import torch
import torch.nn as nn

# VGG-11 layout (Simonyan & Zisserman 2015, configuration "A"): channel multipliers
# of the base width, "M" = 2x2 max pooling.
VGG11_LAYOUT: tuple[int | str, ...] = (1, "M", 2, "M", 4, 4, "M", 8, 8, "M", 8, 8, "M")


class Selector(nn.Module):
    """VGG-11-style classifier that predicts which training site an image resembles.

    FedSM's selector (Xu et al. 2022, Sec. 3.1) outputs ``y_s = softmax(f_s(x))``
    over the K training sites. The original VGG-11 head has two 4096-wide fully
    connected layers (about 129 M parameters); here the convolutional trunk is kept
    and the head is global average pooling followed by one linear layer, so the
    selector has about 2.3 M parameters at ``width=32``.

    There is no batch normalization on purpose: every local batch holds images of a
    single site, and batch statistics would normalize away the very intensity and
    colour cues that identify a site.

    Parameters
    ----------
    num_sites : int
        K, the number of training sites (output classes).
    width : int
        Channels of the first convolution; later stages use 2x, 4x and 8x.
    in_channels : int
        Input image channels.
    """

    def __init__(self, num_sites: int, width: int = 32, in_channels: int = 3) -> None:
        super().__init__()
        if num_sites < 1:
            raise ValueError(f"Selector: num_sites must be >= 1, got {num_sites}")
        if width < 1:
            raise ValueError(f"Selector: width must be >= 1, got {width} (set selector-width)")
        layers: list[nn.Module] = []
        channels = in_channels
        for item in VGG11_LAYOUT:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
                continue
            out = int(item) * width
            layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
            channels = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, num_sites)
        self.feature_dim = channels
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Pooled features ``[B, 8 * width]`` (used for embeddings of the sites)."""
        # Centre the [0, 1] input so the first ReLUs start in their linear range.
        return self.pool(self.features(images - 0.5)).flatten(1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Site logits ``[B, K]`` for images ``[B, C, H, W]`` with values in ``[0, 1]``."""
        return self.classifier(self.embed(images))
