"""Segmentation metrics: Dice per structure, per image."""

from __future__ import annotations

import numpy as np
import torch


def dice_per_structure(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Hard Dice of binary masks for every image and structure.

    ``Dice = 2 |P & Y| / (|P| + |Y|)``; when both masks are empty the structure
    is perfectly predicted and its Dice is 1.

    Parameters
    ----------
    pred, target : torch.Tensor
        Binary masks ``[B, C, H, W]`` (bool or {0, 1}).

    Returns
    -------
    torch.Tensor
        Float64 tensor ``[B, C]``.
    """
    if pred.shape != target.shape:
        raise ValueError(
            f"dice_per_structure: prediction shape {tuple(pred.shape)} != target shape "
            f"{tuple(target.shape)}"
        )
    pred = pred.bool().flatten(2)
    target = target.bool().flatten(2)
    intersection = (pred & target).sum(-1).double()
    total = pred.sum(-1).double() + target.sum(-1).double()
    dice = torch.where(total > 0, 2.0 * intersection / total.clamp(min=1.0), torch.ones_like(total))
    return dice


def dice_per_image(logits: torch.Tensor, target: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """Dice per image, the mean over structures (the paper's mean of disc and cup).

    Parameters
    ----------
    logits : torch.Tensor
        Raw outputs ``[B, C, H, W]``; a pixel is foreground when
        ``sigmoid(logit) > threshold``.
    target : torch.Tensor
        Binary targets ``[B, C, H, W]``.

    Returns
    -------
    torch.Tensor
        Float64 tensor ``[B]``.
    """
    pred = torch.sigmoid(logits) > threshold
    return dice_per_structure(pred, target).mean(dim=1)


class DiceAccumulator:
    """Collects per-image Dice values and reports their mean (images weigh equally)."""

    def __init__(self) -> None:
        self._values: list[np.ndarray] = []

    def add(self, per_image_dice: torch.Tensor | np.ndarray) -> None:
        """Append a batch of per-image Dice values."""
        values = per_image_dice.detach().cpu().numpy() if isinstance(per_image_dice, torch.Tensor) else per_image_dice
        self._values.append(np.asarray(values, dtype=np.float64).reshape(-1))

    @property
    def count(self) -> int:
        """Number of images seen."""
        return int(sum(v.size for v in self._values))

    def mean(self) -> float:
        """Mean Dice over all images; NaN when no image was added."""
        if not self._values:
            return float("nan")
        return float(np.concatenate(self._values).mean())
