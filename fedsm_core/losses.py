"""Segmentation losses."""

from __future__ import annotations

import torch


def soft_dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """Soft Dice loss averaged over images and structures.

    For each image ``b`` and structure channel ``c`` with probabilities
    ``p = sigmoid(logits)``::

        L_bc = 1 - (2 * sum(p * y) + eps) / (sum(p) + sum(y) + eps)

    and the loss is the mean of ``L_bc`` (Milletari et al., V-Net, 2016).

    Parameters
    ----------
    logits : torch.Tensor
        Raw model outputs, shape ``[B, C, H, W]``.
    target : torch.Tensor
        Binary targets of the same shape.
    eps : float
        Smoothing term; keeps the loss defined for empty masks.

    Returns
    -------
    torch.Tensor
        Scalar loss in ``[0, 1]``.
    """
    if logits.shape != target.shape:
        raise ValueError(
            f"soft_dice_loss: logits shape {tuple(logits.shape)} != target shape "
            f"{tuple(target.shape)}; the model must output one channel per structure"
        )
    probs = torch.sigmoid(logits)
    dims = tuple(range(2, logits.ndim))
    intersection = (probs * target).sum(dims)
    denominator = probs.sum(dims) + target.sum(dims)
    return (1.0 - (2.0 * intersection + eps) / (denominator + eps)).mean()


def soft_dice_loss_per_image(logits: torch.Tensor, target: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """Soft Dice loss per image (mean over structures), shape ``[B]``.

    Used by FedSM-extra to find which model fits an image best.
    """
    if logits.shape != target.shape:
        raise ValueError(
            f"soft_dice_loss_per_image: logits shape {tuple(logits.shape)} != target shape {tuple(target.shape)}"
        )
    probs = torch.sigmoid(logits)
    dims = tuple(range(2, logits.ndim))
    intersection = (probs * target).sum(dims)
    denominator = probs.sum(dims) + target.sum(dims)
    return (1.0 - (2.0 * intersection + eps) / (denominator + eps)).mean(dim=1)
