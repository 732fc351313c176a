"""Segmentation metrics: Dice per structure, per image, with images without foreground apart.

An image whose target has no foreground in any structure (an MR slice above
the prostate) scores Dice 1 whenever the model predicts nothing, so a few such
images lift a mean a lot. :class:`ImageScores` therefore keeps them apart:
Dice means run over images with foreground only, and the empty images get
their own count (``num-empty``) and false-positive rate
(``empty-fp-<model>``: the share of empty images where the model predicts any
foreground pixel).
"""

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


def has_foreground(target: torch.Tensor) -> torch.Tensor:
    """``bool [B]``: whether each image's target ``[B, C, H, W]`` has any foreground pixel."""
    return target.bool().flatten(1).any(dim=1)


def predicts_foreground(logits: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """``bool [B]``: whether the prediction for each image has any foreground pixel."""
    return (torch.sigmoid(logits) > threshold).flatten(1).any(dim=1)


def empty_fp_key(dice_key: str) -> str:
    """The false-positive-rate key of a Dice key: ``dice-global`` -> ``empty-fp-global``."""
    return "empty-fp-" + dice_key.removeprefix("dice-")


def split_scores(dice: torch.Tensor | np.ndarray, predicted: torch.Tensor | np.ndarray,
                 foreground: torch.Tensor | np.ndarray, name: str = "dice-global") -> dict[str, float]:
    """Mean Dice over images with foreground, and the empty images' count and false-positive rate.

    Parameters
    ----------
    dice : array ``[N]``
        Per-image Dice.
    predicted : bool array ``[N]``
        Whether the model predicted any foreground in each image.
    foreground : bool array ``[N]``
        Whether each image's target has foreground.
    name : str
        The Dice key, e.g. ``dice-global``.

    Returns
    -------
    dict
        ``{name: mean Dice (NaN without images with foreground), "num-empty": E}``
        and, when ``E > 0``, ``empty-fp-...``: predicted-foreground images / E.
    """
    dice, predicted, foreground = (np.asarray(torch.as_tensor(a).cpu(), dtype=np.float64).reshape(-1)
                                   for a in (dice, predicted, foreground))
    kept, empty = foreground > 0, foreground == 0
    scores = {name: float(dice[kept].mean()) if kept.any() else float("nan"), "num-empty": float(empty.sum())}
    if empty.any():
        scores[empty_fp_key(name)] = float(predicted[empty].mean())
    return scores


class ImageScores:
    """Collects per-image Dice, predicted-foreground flags and target-foreground flags of one model."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, logits: torch.Tensor, target: torch.Tensor, threshold: float = 0.5) -> None:
        """Score a batch: logits and binary targets ``[B, C, H, W]``."""
        self.add_scores(dice_per_image(logits, target, threshold), predicts_foreground(logits, threshold),
                        has_foreground(target))

    def add_scores(self, dice: torch.Tensor, predicted: torch.Tensor, foreground: torch.Tensor) -> None:
        """Add already computed per-image values (``[B]`` each)."""
        self._parts.append(tuple(np.asarray(torch.as_tensor(a).detach().cpu(), dtype=np.float64).reshape(-1)
                                 for a in (dice, predicted, foreground)))

    def result(self, name: str = "dice-global") -> dict[str, float]:
        """:func:`split_scores` of everything added."""
        if not self._parts:
            return {name: float("nan"), "num-empty": 0.0}
        return split_scores(*(np.concatenate(column) for column in zip(*self._parts, strict=True)), name=name)
