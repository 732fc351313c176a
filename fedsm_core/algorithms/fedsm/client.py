"""FedSM client side: one round of Algorithm 1 on one site's data."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fedsm_core.algorithms.fedsm.fedsm import FedSMPayload, FedSMUpdate
from fedsm_core.algorithms.personalization.base import PersonalStart
from fedsm_core.algorithms.personalization.registry import personalization
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.data.style import randomize_style, restyled_batch
from fedsm_core.losses import soft_dice_loss
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import Weights, get_weights
from fedsm_core.training.batches import iterate_batches
from fedsm_core.training.local_update import BatchFn, Learner, TrainingHook, segmentation_batch, train_on_split
from fedsm_core.training.optimizer_state import (
    adam_state_to_arrays,
    learners_state_to_arrays,
    load_adam_state,
    load_learners_state,
    new_adam,
)
from fedsm_core.training.weight_perturbation import WeightPerturbation


def site_batch(site_index: int, num_sites: int, negatives: bool, generator: torch.Generator | None = None):
    """Selector inputs and targets for a batch of site ``k``.

    Algorithm 1's target is ``one_hot(k)`` for every image. With ``negatives``,
    each image is also shown with a random acquisition style
    (:func:`fedsm_core.data.style.randomize_style`) and the target "any other
    site", ``(1 - one_hot(k)) / (K - 1)``. A site's local loss then cannot be
    minimised by calling every image its own, which is what collapses a
    selector trained on one label per client; it has to recognise its own
    acquisition style.
    """

    def batch(images: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        own = F.one_hot(torch.full((len(images),), site_index, device=images.device), num_sites).to(images.dtype)
        if not negatives or num_sites < 2:
            return images, own
        others = (1.0 - own) / (num_sites - 1)
        return torch.cat([images, randomize_style(images, generator)]), torch.cat([own, others])

    return batch


def train_fedsm_client(
    payload: FedSMPayload,
    site_index: int,
    data: SegArrays,
    spec: ModelSpec,
    settings: RoundSettings,
    device: torch.device,
    client_state: Weights | None = None,
    optimizer_state: Weights | None = None,
) -> tuple[FedSMUpdate, dict[str, float]]:
    """Train the global copy, the site's personalized model and the selector.

    For every minibatch: one Adam step on the global copy (soft Dice loss), one on
    personalized model ``k`` (soft Dice loss) and one on the selector with target
    ``one_hot(k)`` (cross-entropy; see :func:`site_batch` for the optional
    site-contrast negatives). The selector's Adam starts from the moments the
    server averaged and returns its new moments.

    How the personalized model is trained is ``settings.personalization.method``
    (:mod:`fedsm_core.algorithms.personalization`); FedSM's own is a plain
    Adam step on the model the server sent. ``client_state`` is what this site
    kept from its previous round (``update.client_state`` of that round).
    ``optimizer_state`` (``optimizer-state = local``) is the Adam state this
    site's global copy, and its personalized model where that takes plain
    optimizer steps, ended their previous round with (``{}`` in the first
    round); ``None`` starts fresh Adams, as the paper does.

    Returns
    -------
    (FedSMUpdate, dict)
        The update for the server and the mean losses / step count.
    """
    if not 0 <= site_index < spec.num_sites:
        raise ValueError(f"site index {site_index} is outside 0..{spec.num_sites - 1}")
    global_model = spec.load_segmentation(payload.global_weights, "global model").to(device)
    personal = personalization(settings.personalization.method).start(PersonalStart(
        global_model, payload.global_weights, payload.personal_weights, client_state or {},
        build=lambda: spec.blank_segmentation().to(device),  # model_from overwrites every weight
        optimizer=lambda parameters: new_adam(parameters, settings.lr),
        loss_fn=soft_dice_loss, settings=settings.personalization,
    ))
    selector = spec.load_selector(payload.selector_weights).to(device)
    selector_step = selector_learner(selector, payload.selector_optimizer, site_index, spec.num_sites, settings)
    learners = [
        Learner("global", global_model, new_adam(global_model.parameters(), settings.lr), soft_dice_loss,
                segmentation_batch_fn(settings), segmentation_hooks(settings)),
        personal.learner,
    ]
    plain_step = personalization(settings.personalization.method).plain_step
    if plain_step:
        personal.learner.hooks = [*personal.learner.hooks, *segmentation_hooks(settings)]
        personal.learner.batch_fn = segmentation_batch_fn(settings)
    # The selector's moments follow selector-moments; a special personal learner's optimizer is its own affair
    kept = learners[:2] if plain_step else learners[:1]
    if optimizer_state is not None:
        load_learners_state(kept, optimizer_state)
    if settings.train_selector:  # FedSM-extra trains its selector only in the extra rounds
        learners.append(selector_step)
    metrics = train_on_split(learners, data, settings.batch_size, settings.local_epochs,
                             settings.max_local_steps, settings.seed, device,
                             settings.augmentation, settings.precision, settings.min_local_steps)
    update = FedSMUpdate(
        global_weights=get_weights(global_model),
        personal_weights=personal.deployed(lambda: iterate_batches(data, settings.batch_size, shuffle=False)),
        selector_weights=get_weights(selector),
        selector_optimizer=adam_state_to_arrays(selector, selector_step.optimizer),
        num_examples=len(data.images),
        client_state=personal.client_state(),
        steps=metrics["steps"],
        optimizer_state=learners_state_to_arrays(kept) if optimizer_state is not None else None,
    )
    return update, metrics


def selector_learner(selector: nn.Module, moments: Weights, site_index: int, num_sites: int,
                     settings: RoundSettings) -> Learner:
    """The selector's learner at site ``k``.

    Adam from the server's averaged ``moments``, cross-entropy on :func:`site_batch`.
    """
    optimizer = new_adam(selector.parameters(), settings.selector_lr)
    load_adam_state(selector, optimizer, moments)
    style_generator = torch.Generator().manual_seed(settings.seed + 1)
    return Learner("selector", selector, optimizer, F.cross_entropy,
                   site_batch(site_index, num_sites, settings.selector_negatives, style_generator))


def segmentation_hooks(settings: RoundSettings) -> list[TrainingHook]:
    """Hooks every segmentation learner gets: HarmoFL's weight perturbation when ``perturbation_alpha > 0``."""
    return [WeightPerturbation(settings.perturbation_alpha)] if settings.perturbation_alpha > 0 else []


def segmentation_batch_fn(settings: RoundSettings) -> BatchFn:
    """The batch function of every segmentation learner: the batch as it is, or restyled (``style-augmentation``).

    Each learner gets its own generator from the same seed, so FedSM's global
    copy sees the very images a FedAvg site would.
    """
    if settings.style_augmentation == 0.0:
        return segmentation_batch
    return restyled_batch(settings.style_augmentation, torch.Generator().manual_seed(settings.seed + 2))
