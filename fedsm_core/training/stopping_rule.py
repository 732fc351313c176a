"""When a federated run has converged: the best validation score has stopped rising.

A run lasts at least ``min-rounds`` and at most ``max-rounds`` rounds. From
``min-rounds`` on, every ``check-every`` rounds, it stops once the best pooled
validation score of some evaluated round ``r >= min-rounds`` has gained less
than ``min-gain`` over the ``window`` rounds before ``r``:

    gain(r) = max_{t <= r} D(t) - max_{t <= r - window} D(t)

where ``D(t)`` is the score at an evaluated round ``t`` (validation may run
only every few rounds). The ServerApp applies it during a run (``stop-window``
and the other ``stop-*`` keys); ``experiments.study.run_plan`` gives every run of a
study the same rule. Checking only at ``min-rounds + k * check-every`` makes the
stopping round the same whether a run goes on in one piece or is resumed from
its checkpoint at those rounds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from fedsm_core.checks import check_settings, setting

Curve = Sequence[tuple[int, float]]


@dataclasses.dataclass(frozen=True)
class StoppingRule:
    """Train until the best validation score has gained less than ``min-gain`` over the last ``window`` rounds.

    Scores are Dice in [0, 1]: 0.2 Dice points = 0.002.
    """

    min_rounds: int = 60
    max_rounds: int = 150
    window: int = 20
    min_gain: float = 0.002
    check_every: int = 10

    def __post_init__(self) -> None:
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"the stopping rule needs 1 <= min-rounds <= max-rounds, got {self.min_rounds} and "
                             f"{self.max_rounds}")
        if self.window < 1 or self.check_every < 1 or not math.isfinite(self.min_gain) or self.min_gain < 0:
            raise ValueError(f"the stopping rule needs window = {self.window} and check-every = {self.check_every} "
                             f">= 1, and min-gain = {self.min_gain} >= 0")

    def checks_at(self, server_round: int) -> bool:
        """Whether the rule is looked at after ``server_round`` (``min-rounds + k * check-every``)."""
        return server_round >= self.min_rounds and (server_round - self.min_rounds) % self.check_every == 0


@dataclasses.dataclass(frozen=True)
class StoppingSettings:
    """The ``stop-*`` run-config keys; ``stop-window = 0`` (the default) turns the rule off.

    Attributes
    ----------
    window, min_gain, min_rounds, check_every
        ``stop-window``, ``stop-min-gain``, ``stop-min-rounds`` and
        ``stop-check-every``: :class:`StoppingRule`'s ``window``, ``min_gain``,
        ``min_rounds`` and ``check_every``; its ``max_rounds`` is the run's
        ``num-server-rounds``.
    """

    window: int = setting(0, "stop-window", low=0, high=100_000)
    min_gain: float = setting(0.002, "stop-min-gain", low=0.0, high=1.0)
    min_rounds: int = setting(1, "stop-min-rounds", low=1, high=100_000, allowed="[1, num-server-rounds]")
    check_every: int = setting(1, "stop-check-every", low=1, high=100_000)

    def __post_init__(self) -> None:
        check_settings(self)

    def rule(self, max_rounds: int) -> StoppingRule | None:
        """The rule of a run of at most ``max_rounds`` rounds; ``None`` when ``stop-window = 0``."""
        if not self.window:
            return None
        if self.min_rounds > max_rounds:
            raise ValueError(f"stop-min-rounds = {self.min_rounds} is outside [1, {max_rounds}] (num-server-rounds)")
        return StoppingRule(min_rounds=self.min_rounds, max_rounds=max_rounds, window=self.window,
                            min_gain=self.min_gain, check_every=self.check_every)


def gain_over_window(curve: Curve, server_round: int, window: int) -> float:
    """``best(<= r) - best(<= r - window)`` of a validation curve; ``inf`` if no round ``<= r - window`` was evaluated.

    ``best(<= x)`` is the highest value at an evaluated round ``<= x``.
    """
    now = [value for r, value in curve if r <= server_round]
    before = [value for r, value in curve if r <= server_round - window]
    if not now or not before:
        return math.inf
    return max(now) - max(before)


def stopping_round(curve: Curve, rule: StoppingRule) -> int | None:
    """The first evaluated round ``>= min-rounds`` where the rule holds, ``max-rounds`` if reached, else ``None``."""
    for server_round in sorted({r for r, _ in curve}):
        if server_round > rule.max_rounds:
            break
        if server_round >= rule.min_rounds and gain_over_window(curve, server_round, rule.window) < rule.min_gain:
            return server_round
    return rule.max_rounds if any(r >= rule.max_rounds for r, _ in curve) else None


def stops_after(curve: Curve, server_round: int, rule: StoppingRule) -> bool:
    """Whether a run ends after ``server_round``: ``max-rounds``, or a check round with validation where the rule held.

    A run stops early only right after a validation round, so the settings
    chosen on validation (FedSM's gamma) come from the round it stops at.
    """
    if server_round >= rule.max_rounds:
        return True
    seen = [(r, v) for r, v in curve if r <= server_round]
    if not rule.checks_at(server_round) or not seen or seen[-1][0] != server_round:
        return False
    return stopping_round(seen, rule) is not None


def validation_curve(rows: Iterable[Sequence[object]], metric: str) -> list[tuple[int, float]]:
    """Pooled validation ``metric`` per evaluated round from ``(round, split, site, metric, value)`` rows.

    A score computed only at test time (kNN-Per's) falls back to ``dice-global``
    on validation.
    """
    rows = [tuple(row) for row in rows]
    for name in (metric, "dice-global"):
        curve = [(int(r[0]), float(r[4])) for r in rows if r[1] == "val" and r[2] == "pooled" and r[3] == name]
        if curve:
            return sorted(curve)
    return []
