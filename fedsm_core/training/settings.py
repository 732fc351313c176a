"""Local training's run-config keys, checked once: batch, steps per round, augmentation, learning rate, precision.

Every site trains its models with the one local loop
(:mod:`fedsm_core.training.local_update`); these keys say how long (one pass
over the site's images per round, or a fixed number of minibatches), on what
(augmented) batches, and at what learning rate over the rounds. What one site
trains with in one round is derived from them by
:meth:`fedsm_core.config.RunConfig.round_settings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fedsm_core.checks import check_settings, setting
from fedsm_core.data.augment import AUGMENTATIONS
from fedsm_core.training.batches import batches_per_pass
from fedsm_core.training.local_update import stretch_to_min_steps
from fedsm_core.training.lr_schedule import LRSchedule
from fedsm_core.training.optimizer_state import OPTIMIZER_STATES
from fedsm_core.training.precision import PRECISIONS

# Below this many minibatches a round at every site, min-local-steps = 8 measured better (short_round_hint).
SHORT_ROUND = 4


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """How each site trains in a round.

    Attributes
    ----------
    batch_size : int
        Images per minibatch (``batch-size``).
    local_epochs : int
        Passes over the site's training images per round (``local-epochs``).
    max_local_steps : int
        Cap on minibatches per round, 0 for none (``max-local-steps``).
    local_steps : int
        Every site takes exactly this many minibatches per round, as many passes
        as that needs; 0 lets each site take one pass of its own length
        (``local-steps``; FedAvg's sites of 12 and 100 images otherwise take 2
        and 13 steps).
    min_local_steps : int
        A site whose round would take fewer minibatches takes exactly this
        many; a longer round is unchanged (``min-local-steps``; 0: never).
        The rule for federations with sites of a few images.
    augmentation : str
        ``none``, ``flip`` or ``affine`` (``augmentation``).
    style_augmentation : float
        Probability that a training image gets a random acquisition style
        (``style-augmentation``).
    lr : float
        Adam's learning rate in rounds where the schedule's factor is 1 (``lr``).
    schedule : LRSchedule
        The factor of ``lr`` over rounds (``lr-schedule``, ``lr-warmup-rounds``, ``lr-min-factor``).
    optimizer_state : str
        A site's Adam state for every model it trains: ``reset`` (fresh every
        round), ``local`` (kept at the site) or ``averaged`` by the server
        (``optimizer-state``).
    precision : str
        ``auto``, ``fp32``, ``bf16`` or ``fp16`` (``precision``; see
        :mod:`fedsm_core.training.precision`).
    """

    batch_size: int = setting(8, "batch-size", low=1, high=4096)
    local_epochs: int = setting(1, "local-epochs", low=1, high=1000)
    max_local_steps: int = setting(0, "max-local-steps", low=0, high=10**9)
    local_steps: int = setting(0, "local-steps", low=0, high=10**9)
    min_local_steps: int = setting(0, "min-local-steps", low=0, high=10**9)
    augmentation: str = setting("flip", "augmentation", choices=AUGMENTATIONS)
    style_augmentation: float = setting(0.0, "style-augmentation", low=0.0, high=1.0)
    lr: float = setting(2e-3, "lr", low=1e-8, high=10.0)
    schedule: LRSchedule = LRSchedule()
    optimizer_state: str = setting("reset", "optimizer-state", choices=OPTIMIZER_STATES)
    precision: str = setting("auto", "precision", choices=PRECISIONS)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.local_steps and (self.local_epochs != 1 or self.max_local_steps):
            raise ValueError(f"local-steps = {self.local_steps} sets every site's number of minibatches per round by "
                             f"itself, but local-epochs = {self.local_epochs} and max-local-steps = "
                             f"{self.max_local_steps} are set too; keep local-epochs = 1 and max-local-steps = 0, "
                             f"or set local-steps = 0")
        if self.min_local_steps and (self.local_steps or 0 < self.max_local_steps < self.min_local_steps):
            raise ValueError(f"min-local-steps = {self.min_local_steps} conflicts with local-steps = "
                             f"{self.local_steps} and max-local-steps = {self.max_local_steps}: set local-steps = 0 "
                             f"and max-local-steps to 0 or at least min-local-steps")

    def epochs_and_steps(self) -> tuple[int, int]:
        """``(local epochs, step cap)`` of a round: ``local-steps = S`` is ``S`` passes capped at ``S`` minibatches.

        Each pass yields at least one minibatch, so ``S`` passes always reach
        ``S`` steps.
        """
        if self.local_steps:
            return self.local_steps, self.local_steps
        return self.local_epochs, self.max_local_steps

    def steps_in_round(self, num_train: int) -> int:
        """Minibatches a site of ``num_train`` training images takes in a round under these settings."""
        epochs, cap = self.epochs_and_steps()
        epochs, cap = stretch_to_min_steps(num_train, self.batch_size, epochs, cap, self.min_local_steps)
        planned = batches_per_pass(num_train, self.batch_size) * epochs
        return planned if cap == 0 else min(planned, cap)

    def short_round_hint(self, train_sizes: Mapping[str, int]) -> str | None:
        """A suggestion when every site's round is shorter than :data:`SHORT_ROUND` minibatches, else ``None``.

        Measured (docs/results.md, "A minimum of local steps per round"): where
        every site takes one to three minibatches a round, ``min-local-steps =
        8`` gained 0.8 points of validation Dice; where the largest sites take
        13 or more it was level.
        """
        steps = {site: self.steps_in_round(size) for site, size in train_sizes.items()}
        if not steps or self.local_steps or self.min_local_steps or max(steps.values()) >= SHORT_ROUND:
            return None
        listed = ", ".join(f"{site} {count}" for site, count in steps.items())
        return (f"every site takes fewer than {SHORT_ROUND} minibatches a round ({listed}); on such federations "
                f"min-local-steps = 8 trained better (docs/results.md, 'A minimum of local steps per round')")

    def lr_in_round(self, server_round: int, total_rounds: int) -> float:
        """``lr`` times the schedule's factor in round ``server_round`` of ``total_rounds``."""
        return self.lr * self.schedule.factor(server_round, total_rounds)
