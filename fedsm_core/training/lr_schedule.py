"""The learning rate over rounds: constant, or a linear warm-up and a cosine decay.

A federated round with ``local-epochs = 1`` is one pass over each site's data,
as one centralized epoch is one pass over the pooled data; the schedule is a
function of that pass count, so centralized training follows the same curve
over its epochs as the federated sites over their rounds.
"""

from __future__ import annotations

import dataclasses
import math

from fedsm_core.checks import check_settings, setting

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

    name: str = setting("constant", "lr-schedule", choices=LR_SCHEDULES)
    warmup_rounds: int = setting(0, "lr-warmup-rounds", low=0, high=100_000)
    min_factor: float = setting(0.0, "lr-min-factor", low=0.0, high=1.0)

    def __post_init__(self) -> None:
        check_settings(self)

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
