"""A study plan (``experiments/plans/*.toml``) parsed once into frozen dataclasses, and the stopping rule.

A plan names the datasets, methods and seeds of a study, the run config every
run shares, per-dataset settings chosen on validation (``chosen.json`` of
:mod:`experiments.tune`) and the rule that decides how many rounds a run gets::

    [study]
    datasets = ["synthetic-fundus", "experiments/federations/drishti-six-site.toml"]
    methods = ["fedavg", "centralized", "fedsm", "fedsm-extra"]
    seeds = [0, 1, 2]

    [stopping]          # see StoppingRule
    min-rounds = 60
    max-rounds = 150
    window = 20
    min-gain = 0.002
    check-every = 10

    [run-config]        # every run
    image-size = 64

    [methods]           # a method that takes its round count from another one
    centralized = { rounds-from = "fedavg" }

    [chosen]            # optional, per dataset
    "synthetic-fundus" = "experiments/results/reference/tune-synthetic-fundus/chosen.json"

Every error names the plan file, the setting, the value found and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

from experiments.compare import FEDERATED, METHOD_SETTINGS, load_chosen
from fedsm_core.config import RunConfig

STUDY_METHODS = ("centralized", *FEDERATED)
# Keys the study sets per run, so a plan may not: the round count comes from the rule, seeds from [study].
STUDY_KEYS = frozenset({"num-server-rounds", "seed", "data-seed", "dataset", "resume-from", "output-dir"})


@dataclasses.dataclass(frozen=True)
class StoppingRule:
    """Train until the best validation Dice has gained less than ``min-gain`` over the last ``window`` rounds.

    A run lasts at least ``min-rounds`` and at most ``max-rounds`` rounds. The
    study trains ``min-rounds`` first and then extends the run by
    ``check-every`` rounds at a time (resuming from its checkpoint) until the
    rule holds, so a run stops at most ``check-every - 1`` rounds after the
    round where it first held. Dice is in [0, 1]: 0.2 Dice points = 0.002.
    """

    min_rounds: int = 60
    max_rounds: int = 150
    window: int = 20
    min_gain: float = 0.002
    check_every: int = 10

    def __post_init__(self) -> None:
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"[stopping] needs 1 <= min-rounds <= max-rounds, got {self.min_rounds} and "
                             f"{self.max_rounds}")
        if self.window < 1 or self.check_every < 1 or not math.isfinite(self.min_gain) or self.min_gain < 0:
            raise ValueError(f"[stopping] window = {self.window} and check-every = {self.check_every} must be >= 1, "
                             f"min-gain = {self.min_gain} >= 0")


def gain_over_window(curve: Sequence[tuple[int, float]], server_round: int, window: int) -> float:
    """``best(<= r) - best(<= r - window)`` of a validation curve; ``inf`` if no round ``<= r - window`` was evaluated.

    ``best(<= x)`` is the highest value at an evaluated round ``<= x`` (the curve
    may be evaluated every few rounds).
    """
    now = [value for r, value in curve if r <= server_round]
    before = [value for r, value in curve if r <= server_round - window]
    if not now or not before:
        return math.inf
    return max(now) - max(before)


def stopping_round(curve: Sequence[tuple[int, float]], rule: StoppingRule) -> int | None:
    """The first evaluated round ``>= min-rounds`` where the rule holds, ``max-rounds`` if reached, else ``None``."""
    for server_round in sorted({r for r, _ in curve}):
        if server_round > rule.max_rounds:
            break
        if server_round >= rule.min_rounds and gain_over_window(curve, server_round, rule.window) < rule.min_gain:
            return server_round
    return rule.max_rounds if any(r >= rule.max_rounds for r, _ in curve) else None


def next_target(curve: Sequence[tuple[int, float]], rounds_run: int, rule: StoppingRule) -> int:
    """Rounds the run should reach: ``rounds_run`` when it is done, else one ``check-every`` more (at most max)."""
    if rounds_run >= rule.max_rounds or stopping_round(curve, rule) is not None:
        return rounds_run
    return min(max(rounds_run + rule.check_every, rule.min_rounds), rule.max_rounds)


@dataclasses.dataclass(frozen=True)
class StudyPlan:
    """What a study runs: datasets x seeds x methods, in that order (a method after any it takes rounds from)."""

    path: Path
    datasets: tuple[str, ...]
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    stopping: StoppingRule
    run_config: Mapping[str, object]
    rounds_from: Mapping[str, str]
    chosen: Mapping[str, Path]

    def settings(self, dataset: str, method: str) -> dict[str, object]:
        """The run config of ``method`` on ``dataset`` (without the seed and round count), chosen values applied."""
        base = {**self.run_config, "dataset": dataset}
        chosen = dict(load_chosen(self.chosen.get(dataset), base)[method])
        return {**chosen, **METHOD_SETTINGS.get(method, {"strategy": method})} if method in FEDERATED else chosen

    def jobs(self) -> list[tuple[str, int, str]]:
        """``(dataset, seed, method)`` in run order."""
        return [(d, s, m) for d in self.datasets for s in self.seeds for m in self.methods]


def _error(path: Path, where: str, problem: str) -> ValueError:
    return ValueError(f"{path}: {where} {problem}")


def _list(path: Path, table: Mapping[str, object], key: str, kind: type) -> tuple:
    values = table.get(key)
    if not isinstance(values, list) or not values or not all(isinstance(v, kind) for v in values):
        raise _error(path, f"[study] {key} = {values!r}", f"must be a non-empty list of {kind.__name__}")
    return tuple(values)


def _stopping(path: Path, table: Mapping[str, object]) -> StoppingRule:
    fields = {f.name.replace("_", "-"): f.name for f in dataclasses.fields(StoppingRule)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise _error(path, f"[stopping] {unknown}", f"are not settings; use some of {sorted(fields)}")
    try:
        return StoppingRule(**{fields[k]: v for k, v in table.items()})
    except (TypeError, ValueError) as error:
        raise _error(path, "[stopping]", str(error)) from None


def _rounds_from(path: Path, methods: tuple[str, ...], table: Mapping[str, object]) -> dict[str, str]:
    found: dict[str, str] = {}
    for method, options in table.items():
        source = options.get("rounds-from") if isinstance(options, dict) else None
        if method not in methods or source not in methods or methods.index(source) >= methods.index(method):
            raise _error(path, f"[methods] {method} = {options!r}", "needs rounds-from = a method listed before it "
                         f"in [study] methods {list(methods)}")
        found[method] = source
    return found


def load_plan(path: str | Path) -> StudyPlan:
    """Read and check a plan; every run's settings are validated here, before anything trains."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"{path}: cannot read the study plan ({error})") from None
    study = raw.get("study", {})
    methods = _list(path, study, "methods", str)
    bad = [m for m in methods if m not in STUDY_METHODS]
    if bad:
        raise _error(path, f"[study] methods {bad}", f"are unknown; use some of {list(STUDY_METHODS)}")
    run_config = dict(raw.get("run-config", {}))
    fixed = sorted(STUDY_KEYS & set(run_config))
    if fixed:
        raise _error(path, f"[run-config] {fixed}", "are set by the study; remove them ([study] and [stopping] decide)")
    plan = StudyPlan(
        path=path, datasets=_list(path, study, "datasets", str), methods=methods,
        seeds=_list(path, study, "seeds", int),
        stopping=_stopping(path, raw.get("stopping", {})), run_config=run_config,
        rounds_from=_rounds_from(path, methods, raw.get("methods", {})),
        chosen={d: Path(p) for d, p in raw.get("chosen", {}).items()},
    )
    stray = sorted(set(plan.chosen) - set(plan.datasets))
    if stray:
        raise _error(path, f"[chosen] {stray}", f"are not datasets of [study] {list(plan.datasets)}")
    for dataset in plan.datasets:
        for method in plan.methods:
            try:
                RunConfig.from_mapping(plan.settings(dataset, method))
            except ValueError as error:
                raise _error(path, f"dataset {dataset}, method {method}:", str(error)) from None
    return plan
