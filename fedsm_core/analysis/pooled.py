"""Training without federation: centralized (pooled sites) and local (one site) baselines.

They use the same model, optimizer, loss, augmentation and local-training loop
as the federated strategies; one epoch here is one pass over the given data,
as one round with ``local-epochs = 1`` is for a federated site.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from fedsm_core.algorithms.fedsm.client import segmentation_batch_fn
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SegArrays, merged_spacings
from fedsm_core.evaluation.super_model_evaluation import evaluate_model
from fedsm_core.losses import soft_dice_loss
from fedsm_core.models.spec import ModelSpec
from fedsm_core.run_files.run_outputs import pool_site_metrics
from fedsm_core.training.batches import iterate_batches
from fedsm_core.training.local_update import Learner, train_local
from fedsm_core.training.optimizer_state import new_adam

EpochCallback = Callable[[int, float], None]


def concat_arrays(parts: Sequence[SegArrays]) -> SegArrays:
    """Pool several sites' splits into one."""
    if not parts:
        raise ValueError("concat_arrays: nothing to pool")
    return SegArrays(
        np.concatenate([p.images for p in parts]),
        np.concatenate([p.masks for p in parts]),
        tuple(i for p in parts for i in p.ids),
        merged_spacings(parts),
    )


def train_on_arrays(
    spec: ModelSpec,
    data: SegArrays,
    settings: RoundSettings,
    epochs: int,
    validation: Mapping[str, SegArrays],
    device: torch.device | str = "cpu",
    on_epoch: EpochCallback | None = None,
    lr_factor: Callable[[int], float] | None = None,
    restart_every: int = 0,
) -> torch.nn.Module:
    """Train one fresh U-Net on ``data`` for ``epochs`` passes.

    After every epoch the pooled validation Dice over ``validation`` (site ->
    split) is passed to ``on_epoch(epoch, dice)``, for training curves.
    ``lr_factor(epoch)`` (1-based), when given, scales ``settings.lr`` in that
    epoch, as the schedule over rounds scales a federated site's
    (:func:`pass_lr_factor`). ``restart_every = n > 0`` starts a fresh Adam
    before passes ``n + 1``, ``2n + 1``, ..., as a site under ``optimizer-state
    = "reset"`` starts one every round (:func:`pass_optimizer_restart`); 0 keeps
    one Adam and its moments over all passes.

    Returns
    -------
    torch.nn.Module
        The trained model (in evaluation mode).
    """
    if restart_every < 0:
        raise ValueError(f"restart_every = {restart_every}: expected 0 (one Adam) or a number of passes")
    torch.manual_seed(settings.seed)
    model = spec.build_segmentation().to(device)
    batch_fn = segmentation_batch_fn(settings)  # one style generator over all passes, whatever the restarts
    learner = Learner("model", model, new_adam(model.parameters(), settings.lr), soft_dice_loss, batch_fn)
    generator = torch.Generator().manual_seed(settings.seed)
    for epoch in range(1, epochs + 1):
        if restart_every and epoch > 1 and (epoch - 1) % restart_every == 0:
            learner = Learner("model", model, new_adam(model.parameters(), settings.lr), soft_dice_loss,
                              batch_fn)
        if lr_factor is not None:
            for group in learner.optimizer.param_groups:
                group["lr"] = settings.lr * lr_factor(epoch)
        train_local(
            [learner],
            lambda: iterate_batches(data, settings.batch_size, shuffle=True, augment=settings.augmentation,
                                    generator=generator),
            1,
            settings.max_local_steps,
            device,
            settings.precision,
        )
        if on_epoch is not None and validation:
            per_site = {site: evaluate_model(model, split, device=device) for site, split in validation.items()}
            on_epoch(epoch, pool_site_metrics(per_site)["dice-global"])
    return model.eval()


def centralized_settings(config: RunConfig, seed: int) -> RoundSettings:
    """The settings of centralized training: one pass at a time, the sites' batch, lr and augmentation."""
    return RoundSettings(config.batch_size, 1, config.max_local_steps, config.lr, config.selector_lr, seed,
                         augmentation=config.augmentation, precision=config.precision,
                         style_augmentation=config.style_augmentation)


def pass_optimizer_restart(config: RunConfig) -> int:
    """Passes between fresh Adams of centralized training: ``local-epochs`` under ``optimizer-state = "reset"``.

    Centralized training is the federation's round protocol with one site
    holding every image: under ``reset`` a site starts a fresh Adam every round
    (``local-epochs`` passes), so centralized training does too; under
    ``local`` and ``averaged`` the one site keeps its Adam (0: never restarts).
    One Adam kept over all passes collapsed on ``synthetic-prostate`` (seed 0,
    lr 0.002: validation Dice 0.87 to 0 at pass 45, never recovering), where a
    fresh one every pass did not (``docs/results.md``). The gap ladder keeps one
    Adam on purpose: its one-site rung is the round protocol.
    """
    return config.local_epochs if config.training_settings.optimizer_state == "reset" else 0


def pass_lr_factor(config: RunConfig) -> Callable[[int], float]:
    """The run's lr schedule over centralized passes: pass ``p`` trains at round ``ceil(p / local-epochs)``'s rate."""
    schedule = config.training_settings.schedule
    return lambda epoch: schedule.factor(math.ceil(epoch / config.local_epochs), config.num_server_rounds)
