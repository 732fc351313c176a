"""The learning rate over rounds: constant, or a linear warm-up and a cosine decay.

A federated round with ``local-epochs = 1`` is one pass over each site's data,
as one centralized epoch is one pass over the pooled data; the schedule is a
function of that pass count, so centralized training follows the same curve
over its epochs as the federated sites over their rounds.
"""

from __future__ import annotations

import dataclasses
import math

LR_SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    """The ``lr-schedule``, ``lr-warmup-rounds`` and ``lr-min-factor`` run-config keys.

    Attributes
    ----------
    name : str
        ``constant`` (``lr`` in every round) or ``cosine``.
    warmup_rounds : int
        Rounds of linear warm-up before the decay: round ``r <= W`` trains at
        ``lr * r / (W + 1)``.
    min_factor : float
        The cosine's floor, as a fraction of ``lr``, reached in the last round.
    """

    name: str = "constant"
    warmup_rounds: int = 0
    min_factor: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in LR_SCHEDULES:
            raise ValueError(f"lr-schedule = '{self.name}' is not one of {list(LR_SCHEDULES)}")
        if not 0 <= self.warmup_rounds <= 100_000:
            raise ValueError(f"lr-warmup-rounds = {self.warmup_rounds} is outside [0, 100000]")
        if not 0.0 <= self.min_factor <= 1.0:
            raise ValueError(f"lr-min-factor = {self.min_factor} is outside [0, 1]")

    @classmethod
    def from_run_config(cls, config) -> LRSchedule:
        """The schedule of a :class:`~fedsm_core.config.RunConfig`."""
        return cls(config.lr_schedule, config.lr_warmup_rounds, config.lr_min_factor)

    def factor(self, server_round: int, total_rounds: int) -> float:
        """The multiplier of ``lr`` in round ``server_round`` (1-based) of ``total_rounds``.

        ``constant``: 1 after the warm-up. ``cosine``: with ``W`` warm-up
        rounds, ``T = total_rounds - W`` and ``s = r - W - 1`` in ``0 .. T-1``,
        ``m + (1 - m) * (1 + cos(pi * s / (T - 1))) / 2``: 1 in the first round
        after the warm-up, ``m = min_factor`` in the last. Rounds past
        ``total_rounds`` (a resumed, extended run) stay at ``m``.
        """
        if server_round < 1:
            raise ValueError(f"round {server_round}: rounds count from 1")
        if server_round <= self.warmup_rounds:
            return server_round / (self.warmup_rounds + 1)
        if self.name == "constant":
            return 1.0
        decay_rounds = total_rounds - self.warmup_rounds
        if decay_rounds <= 1:
            return 1.0 if server_round <= total_rounds else self.min_factor
        progress = min((server_round - self.warmup_rounds - 1) / (decay_rounds - 1), 1.0)
        return self.min_factor + (1.0 - self.min_factor) * (1.0 + math.cos(math.pi * progress)) / 2.0
