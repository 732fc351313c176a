"""FedSM client side: one round of Algorithm 1 on one site's data."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from fedsm_core.algorithms.fedsm import FedSMPayload, FedSMUpdate
from fedsm_core.data.arrays import SegArrays
from fedsm_core.losses import soft_dice_loss
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights, set_weights
from fedsm_core.training.batches import iterate_batches
from fedsm_core.training.local_update import Learner, train_local
from fedsm_core.training.optimizer_state import adam_state_to_arrays, load_adam_state


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Local-training settings sent by the server each round."""

    batch_size: int
    local_epochs: int
    max_local_steps: int
    lr: float
    selector_lr: float
    seed: int


def site_label_target(site_index: int):
    """Selector target of Algorithm 1: every image of site ``k`` has label ``k``."""

    def target(images: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return torch.full((len(images),), site_index, dtype=torch.long, device=images.device)

    return target


def train_fedsm_client(
    payload: FedSMPayload,
    site_index: int,
    data: SegArrays,
    spec: ModelSpec,
    settings: TrainSettings,
    device: torch.device,
) -> tuple[FedSMUpdate, dict[str, float]]:
    """Train the global copy, the site's personalized model and the selector.

    For every minibatch: one Adam step on the global copy (soft Dice loss), one on
    personalized model ``k`` (soft Dice loss) and one on the selector with target
    ``one_hot(k)`` (cross-entropy). The selector's Adam starts from the moments
    the server averaged and returns its new moments.

    Returns
    -------
    (FedSMUpdate, dict)
        The update for the server and the mean losses / step count.
    """
    if not 0 <= site_index < spec.num_sites:
        raise ValueError(f"site index {site_index} is outside 0..{spec.num_sites - 1}")
    global_model = _loaded(spec.build_segmentation(), payload.global_weights, "global model", device)
    personal_model = _loaded(spec.build_segmentation(), payload.personal_weights, "personalized model", device)
    selector = _loaded(spec.build_selector(), payload.selector_weights, "selector", device)
    selector_optimizer = torch.optim.Adam(selector.parameters(), lr=settings.selector_lr)
    load_adam_state(selector, selector_optimizer, payload.selector_optimizer)
    learners = [
        Learner("global", global_model, torch.optim.Adam(global_model.parameters(), lr=settings.lr), soft_dice_loss),
        Learner("personal", personal_model, torch.optim.Adam(personal_model.parameters(), lr=settings.lr), soft_dice_loss),
        Learner("selector", selector, selector_optimizer, F.cross_entropy, site_label_target(site_index)),
    ]
    generator = torch.Generator().manual_seed(settings.seed)
    metrics = train_local(
        learners,
        lambda: iterate_batches(data, settings.batch_size, shuffle=True, augment=True, generator=generator),
        settings.local_epochs,
        settings.max_local_steps,
        device,
    )
    update = FedSMUpdate(
        global_weights=get_weights(global_model),
        personal_weights=get_weights(personal_model),
        selector_weights=get_weights(selector),
        selector_optimizer=adam_state_to_arrays(selector, selector_optimizer),
        num_examples=len(data.images),
    )
    return update, metrics


def _loaded(model: nn.Module, weights, where: str, device: torch.device) -> nn.Module:
    set_weights(model, weights, where)
    return model.to(device)
