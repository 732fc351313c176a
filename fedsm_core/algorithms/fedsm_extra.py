"""FedSM-extra (Xu et al. 2022, Sec. 3.1.2): a selector trained afterwards to pick the best model.

After the global and personalized models are trained, extra rounds train a
selector with ``K + 1`` outputs (index 0 = global model, ``k + 1`` = personalized
model of site ``k``). Its target for an image ``h`` with mask ``y`` is the model
with the lowest loss,

    target(h) = argmin_j L(f_j(h), y),   j in {global, personalized_1..K},

so at inference the selector's argmax is used directly and no gamma is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from fedsm_core.losses import soft_dice_loss_per_image


@torch.no_grad()
def candidate_losses(candidates: Sequence[nn.Module], images: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Per-image soft Dice loss of every candidate model, ``[B, len(candidates)]``."""
    if not candidates:
        raise ValueError("candidate_losses: no candidate models")
    losses = []
    for model in candidates:
        model.eval()
        losses.append(soft_dice_loss_per_image(model(images), masks))
    return torch.stack(losses, dim=1)


def best_model_targets(losses: torch.Tensor) -> torch.Tensor:
    """``argmin`` over models per image; ties go to the lowest index (the global model first)."""
    if losses.ndim != 2:
        raise ValueError(f"best_model_targets: losses must be [B, models], got shape {tuple(losses.shape)}")
    return losses.argmin(dim=1)


def extra_selector_batch(candidates: Sequence[nn.Module]):
    """Selector inputs and targets for FedSM-extra: the images and their best model's index."""

    def batch(images: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return images, best_model_targets(candidate_losses(candidates, images, masks))

    return batch


def route_extra(selector_logits: torch.Tensor) -> torch.Tensor:
    """FedSM-extra routing: ``argmax - 1``, so -1 is the global model and ``k`` site ``k``'s model."""
    if selector_logits.ndim != 2 or selector_logits.shape[1] < 2:
        raise ValueError(f"route_extra: logits must be [B, K + 1] with K >= 1, got {tuple(selector_logits.shape)}")
    return selector_logits.argmax(dim=1) - 1
