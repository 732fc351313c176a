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

    [measured-with]     # optional: defaults that changed after the study's first runs
    aggregation = "mean"

    [methods]           # a method that takes its round count from another one
    centralized = { rounds-from = "fedavg" }
    # the same rounds as FedSM's, only what follows the last round differs: finish FedSM's checkpoint
    fedsm-softpull = { rounds-from = "fedsm", reuse-rounds = true }

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
from fedsm_core.run_files.checkpoint import AFTER_TRAINING
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
    # methods whose rounds are their source's (``reuse-rounds``): the study finishes the source's checkpoint of
    # its last round with the method's settings instead of training the rounds again (checked by check_reuse)
    reuse_rounds: frozenset[str] = frozenset()
    # defaults that changed while the study ran: every run keeps the value its finished runs were measured with,
    # and the value stays out of a run's key (keyed), so the runs that finished before the change keep theirs
    measured_with: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def settings(self, dataset: str, method: str) -> dict[str, object]:
        """The run config of ``method`` on ``dataset`` (without the seed and round count), chosen values applied."""
        base = {**self.measured_with, **self.run_config, "dataset": dataset}
        chosen = dict(load_chosen(self.chosen.get(dataset), base)[method])
        return {**chosen, **METHOD_SETTINGS.get(method, {"strategy": method})} if method in FEDERATED else chosen

    def keyed(self, settings: Mapping[str, object]) -> dict[str, object]:
        """What a run's key hashes: ``settings`` without the values ``[measured-with]`` gives them.

        A run's key is then the one it had before the default changed; the
        record of its whole run config (:mod:`experiments.study.run_configs`)
        still holds the value, so a run measured with another one is stale.
        """
        return {key: value for key, value in settings.items()
                if key not in self.measured_with or value != self.measured_with[key]}

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


METHOD_OPTIONS = ("rounds-from", "reuse-rounds")


def _method_options(path: Path, methods: tuple[str, ...],
                    table: Mapping[str, object]) -> tuple[dict[str, str], frozenset[str]]:
    """``[methods]``: each method's ``rounds-from`` source, and the methods that reuse its rounds."""
    found: dict[str, str] = {}
    reuse: set[str] = set()
    for method, options in table.items():
        source = options.get("rounds-from") if isinstance(options, dict) else None
        if method not in methods or source not in methods or methods.index(source) >= methods.index(method):
            raise _error(path, f"[methods] {method} = {options!r}", "needs rounds-from = a method listed before it "
                         f"in [study] methods {list(methods)}")
        unknown = sorted(set(options) - set(METHOD_OPTIONS))
        if unknown or not isinstance(options.get("reuse-rounds", False), bool):
            raise _error(path, f"[methods] {method} = {options!r}", f"may set {list(METHOD_OPTIONS)} only, "
                         f"reuse-rounds as true or false")
        found[method] = source
        if options.get("reuse-rounds", False):
            reuse.add(method)
    return found, frozenset(reuse)


def check_reuse(plan: StudyPlan, dataset: str, method: str) -> None:
    """Refuse ``reuse-rounds`` where the method's rounds would not train exactly as its source's.

    Its settings may differ from the source's only in keys that act after the
    last round (:data:`~fedsm_core.run_files.checkpoint.AFTER_TRAINING`), and
    the learning rate may not follow a schedule over ``num-server-rounds``
    (the source ran to the rule with ``max-rounds``, the method for the
    source's rounds).
    """
    source = plan.rounds_from[method]
    mine = RunConfig.from_mapping(plan.settings(dataset, method)).to_mapping()
    theirs = RunConfig.from_mapping(plan.settings(dataset, source)).to_mapping()
    differ = sorted(k for k in mine if k not in AFTER_TRAINING and mine[k] != theirs[k])
    where = f"[methods] {method}: reuse-rounds = true on dataset {dataset}"
    if "centralized" in (method, source):
        raise _error(plan.path, where, "needs federated runs on both sides (centralized training keeps no "
                     "checkpoint); remove reuse-rounds")
    if differ:
        details = ", ".join(f"{k}: {theirs[k]!r} -> {mine[k]!r}" for k in differ)
        raise _error(plan.path, where, f"needs rounds that train as {source}'s, but the settings differ in "
                     f"{details} (only {sorted(AFTER_TRAINING)} may); remove reuse-rounds")
    if mine["lr-schedule"] != "constant":
        raise _error(plan.path, where, f"needs a constant learning rate, found lr-schedule = "
                     f"{mine['lr-schedule']!r}, which follows num-server-rounds; remove reuse-rounds")


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
    measured_with = dict(raw.get("measured-with", {}))
    pinned = sorted((STUDY_KEYS | set(run_config)) & set(measured_with))
    if pinned:
        raise _error(path, f"[measured-with] {pinned}", "are set by the study or by [run-config]; name each key in "
                     "one place ([measured-with] keeps a changed default out of the runs' keys)")
    rounds_from, reuse = _method_options(path, methods, raw.get("methods", {}))
    plan = StudyPlan(
        path=path, datasets=_list(path, study, "datasets", str), methods=methods,
        seeds=_list(path, study, "seeds", int),
        stopping=_stopping(path, raw.get("stopping", {})), run_config=run_config,
        rounds_from=rounds_from, chosen={d: Path(p) for d, p in raw.get("chosen", {}).items()},
        reuse_rounds=reuse, measured_with=measured_with,
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
            if method in plan.reuse_rounds:
                check_reuse(plan, dataset, method)
    return plan
