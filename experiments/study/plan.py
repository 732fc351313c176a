"""A study plan (``experiments/plans/*.toml``) parsed once into frozen dataclasses.

A plan names the datasets, methods and seeds of a study, the run config every
run shares, per-dataset settings chosen on validation (``chosen.json`` of
:mod:`experiments.paper.tune`) and the rule that decides how many rounds a run gets::

    [study]
    datasets = ["synthetic-fundus", "experiments/federations/drishti-six-site.toml"]
    methods = ["fedavg", "centralized", "fedsm", "fedsm-extra"]
    seeds = [0, 1, 2]

    [stopping]          # fedsm_core.training.stopping_rule.StoppingRule
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
from collections.abc import Mapping
from pathlib import Path

import tomllib

from experiments.runner import FEDERATED, METHOD_SETTINGS, load_chosen
from fedsm_core.config import RunConfig
from fedsm_core.training.stopping_rule import StoppingRule

STUDY_METHODS = ("centralized", *FEDERATED)
# Keys the study sets per run, so a plan may not: the round count and stop-* come from the rule, seeds from [study].
STUDY_KEYS = frozenset({"num-server-rounds", "seed", "data-seed", "dataset", "resume-from", "output-dir",
                        "stop-window", "stop-min-gain", "stop-min-rounds", "stop-check-every"})


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
