"""FedSM-extra (Xu et al. 2022, Sec. 3.1.2): a selector trained afterwards to pick the best model.

After the global and personalized models are trained, extra rounds train a
selector with ``K + 1`` outputs (index 0 = global model, ``k + 1`` = personalized
model of site ``k``). Its target for an image ``h`` with mask ``y`` is the model
with the lowest loss,

    target(h) = argmin_j L(f_j(h), y),   j in {global, personalized_1..K},

so at inference the selector's argmax is used directly and no gamma is needed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.losses import soft_dice_loss_per_image
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import Weights, get_weights, set_weights
from fedsm_core.training.local_update import Learner, train_on_split
from fedsm_core.training.optimizer_state import adam_state_to_arrays, load_adam_state, new_adam


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


def extra_spec(spec: ModelSpec) -> ModelSpec:
    """The spec of FedSM-extra's selector: ``K + 1`` outputs."""
    return dataclasses.replace(spec, num_sites=spec.num_sites + 1)


def train_extra_selector_client(
    global_weights: Weights,
    personalized: Sequence[Weights],
    selector_weights: Weights,
    selector_optimizer: Weights,
    data: SegArrays,
    spec: ModelSpec,
    settings: RoundSettings,
    device: torch.device,
) -> tuple[Weights, Weights, dict[str, float]]:
    """One extra round at a site: selector steps toward each image's best model.

    Returns
    -------
    (weights, optimizer moments, metrics)
        The selector after local training, its Adam moments and the mean loss.
    """
    candidates = []
    for index, weights in enumerate([global_weights, *personalized]):
        model = spec.load_segmentation(weights, "global model" if index == 0 else f"personalized model {index - 1}")
        candidates.append(model.to(device))
    selector = extra_spec(spec).build_selector()
    set_weights(selector, selector_weights, "FedSM-extra selector")
    selector.to(device)
    optimizer = new_adam(selector.parameters(), settings.selector_lr)
    load_adam_state(selector, optimizer, selector_optimizer)
    learner = Learner("selector", selector, optimizer, F.cross_entropy, extra_selector_batch(candidates))
    metrics = train_on_split([learner], data, settings.batch_size, settings.local_epochs,
                             settings.max_local_steps, settings.seed, device,
                             settings.augmentation, settings.precision, settings.min_local_steps)
    return get_weights(selector), adam_state_to_arrays(selector, optimizer), metrics
