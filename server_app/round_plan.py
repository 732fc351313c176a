"""How a strategy's rounds run, fixed when it is built: rounds, evaluation schedule, replies, amplitude, state key."""

from __future__ import annotations

import dataclasses

from fedsm_core.algorithms.baselines.harmofl import AmplitudeSchedule
from fedsm_core.algorithms.robust_aggregation import AggregationSettings
from fedsm_core.config import RunConfig


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """How a strategy's rounds run, fixed when it is built.

    Attributes
    ----------
    num_rounds : int
        Total rounds (FedSM-extra: model rounds plus extra rounds); the last one is always evaluated.
    eval_every : int
        Evaluate on validation data every this many rounds (and in the last one).
    min_replies : int
        Fewer valid replies in a round stop the run (resumable from the last checkpoint).
    amplitude : AmplitudeSchedule or None
        HarmoFL's amplitude schedule, for runs with amplitude normalization.
    state_key : str
        Names the run's per-site state at the sites (every message carries it);
        a resumed run keeps its original key (:meth:`SiteStrategy.load_state_dict`).
    aggregation : AggregationSettings
        How every shared model is averaged: the weighted mean, or a robust
        statistic (:mod:`fedsm_core.algorithms.robust_aggregation`).
    """

    num_rounds: int
    eval_every: int = 1
    min_replies: int = 1
    amplitude: AmplitudeSchedule | None = None
    state_key: str = ""
    aggregation: AggregationSettings = AggregationSettings()

    def __post_init__(self) -> None:
        if self.num_rounds < 1 or self.eval_every < 1 or self.min_replies < 1:
            raise ValueError(f"round plan: num_rounds, eval_every and min_replies must be >= 1, got {self}")


def round_plan(config: RunConfig, state_key: str = "") -> RoundPlan:
    """The plan of a run: its total rounds, evaluation schedule, min-replies, amplitude schedule and state key."""
    amplitude = (AmplitudeSchedule(config.amplitude_freeze_round, config.amplitude_decay, config.aggregation_settings)
                 if config.harmofl_settings.amplitude_normalization else None)
    return RoundPlan(config.total_rounds, config.eval_every, config.min_replies, amplitude, state_key,
                     config.aggregation_settings)
