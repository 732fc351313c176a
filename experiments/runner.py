"""What every study script shares: launching a federated run, training the pooled baselines, the method names.

A federated run is one ``scripts/run-simulation.sh`` (the same Flower app as any run) whose
run folder the caller reads; an interrupted run of the same settings continues from its
checkpoint. ``centralized`` (pooled sites) and ``local`` (one model per site, evaluated on
every site) run in this process on the same core code, with as many passes over the data
as the federated runs make. Every federated method, its display name, score and settings
come from the table of methods (:mod:`fedsm_core.methods`).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import tomllib
import torch

from experiments.study.runs import interrupted_checkpoint
from fedsm_core.analysis.pooled import (
    centralized_settings,
    concat_arrays,
    pass_lr_factor,
    pass_optimizer_restart,
    train_on_arrays,
)
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.registry import dataset_info, training_dataset
from fedsm_core.device import select_device, set_cpu_threads
from fedsm_core.evaluation.super_model_evaluation import evaluate_model
from fedsm_core.methods import METHODS as METHOD_TABLE
from fedsm_core.run_files.run_outputs import pool_site_metrics

ROOT = Path(__file__).resolve().parents[1]
# Every federated method, its display name, score and settings come from the table of methods.
FEDERATED = {name: row.display for name, row in METHOD_TABLE.items()}
METHOD_SETTINGS: dict[str, dict[str, object]] = {name: dict(row.settings) for name, row in METHOD_TABLE.items()
                                                 if row.settings}
SCORE = {name: row.score for name, row in METHOD_TABLE.items()}
METHODS = ("centralized", "local", *FEDERATED)
POOLED = "pooled"
NORM_NAMES = {"group": "GroupNorm", "batch": "BatchNorm"}


def method_label(name: str, config: RunConfig) -> str:
    """A table row's name for what ran: ``name``, plus the U-Net's normalization when not its default.

    The default is what ``segmentation-norm = auto`` picks for the strategy
    (batch for FedBN, group otherwise), so ``FedBN`` always means batch-norm
    statistics kept local and ``FedAvg (BatchNorm)`` says that FedAvg ran with
    averaged batch normalization.
    """
    default = RunConfig(strategy=config.strategy).model_norm
    return name if config.model_norm == default else f"{name} ({NORM_NAMES[config.model_norm]})"


def parse_overrides(text: str) -> dict[str, object]:
    """``"k=v k2=v2"`` with TOML values (numbers, true/false, quoted strings) into a dict."""
    values: dict[str, object] = {}
    for item in text.split():
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--run-config item '{item}' is not key=value")
        try:
            values[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            values[key] = raw
    return values


def _format_overrides(values: dict[str, object]) -> str:
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in values.items())


def launch_run(settings: dict[str, object], runs: Path, label: str, env: dict[str, str] | None = None) -> Path:
    """One ``flwr run`` through ``scripts/run-simulation.sh``; returns its run folder.

    The simulation gets one SuperNode per training site; ``env`` adds to (or
    overrides) this process's environment. Raises RuntimeError with the end of
    the run's output when it fails.
    """
    env = {**os.environ, **(env or {}), "FEDSM_RUNS": str(runs), "NUM_SUPERNODES": str(_num_sites(settings))}
    command = ["bash", str(ROOT / "scripts" / "run-simulation.sh"), _format_overrides(settings)]
    print(f"[{label}] {' '.join(command)}", flush=True)
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return _newest_folder(runs)


def launch_in_process(settings: dict[str, object], runs: Path, label: str, env: dict[str, str] | None = None) -> Path:
    """The same run as :func:`launch_run`, in this process (:func:`experiments.in_process_app.run_app`).

    The real ServerApp main loop and ClientApp handlers without the SuperLink,
    Ray and their worker processes: the sites train one after the other on
    this process's ``torch-threads``, so a run takes about one core, and two
    sittings on a 2-core machine train two runs at once where one ``flwr run``
    of two workers leaves a core idle while the server works between the
    exchanges (docs/results.md, "The reference study"). ``tests/test_end_to_end.py``
    checks that both give the same numbers. ``env`` is not supported here
    (the app reads no environment a study sets); the run log goes to this
    process's stderr.
    """
    if env:
        raise ValueError(f"{label}: launch_in_process takes no environment (got {sorted(env)}); use launch_run")
    from experiments.in_process_app import run_app  # the apps load only when a run starts here

    print(f"[{label}] in this process: {_format_overrides(settings)}", flush=True)
    runs.mkdir(parents=True, exist_ok=True)
    try:
        run_app(runs, settings, num_nodes=_num_sites(settings))
    except Exception as error:
        raise RuntimeError(f"{label} failed: {type(error).__name__}: {error}") from error
    return _newest_folder(runs)


def _num_sites(settings: dict[str, object]) -> int:
    """Training sites of the run's dataset: one simulated node each."""
    config = RunConfig.from_mapping(settings)
    return training_dataset(config.dataset, config.held_out_site).num_sites


def _newest_folder(runs: Path) -> Path:
    """The run folder a launch just made under ``runs``."""
    return max(runs.iterdir(), key=lambda p: p.stat().st_mtime)


LAUNCHERS: dict[str, Callable[..., Path]] = {"flwr-run": launch_run, "in-process": launch_in_process}


def run_settings(method: str, seed: int, overrides: dict[str, object]) -> dict[str, object]:
    """The run config of one ``flwr run`` of ``method``: ``overrides`` plus the method's own settings and seed."""
    return {**overrides, **METHOD_SETTINGS.get(method, {"strategy": method}), "seed": seed}


def run_folders(out: Path, method: str, seed: int) -> Path:
    """Where :func:`run_federated` keeps the run folders of ``method`` and ``seed``."""
    return out / "runs" / f"{method}-seed{seed}"


def run_federated(method: str, seed: int, overrides: dict[str, object], out: Path,
                  start: Path | None = None) -> tuple[list[dict], list]:
    """One ``flwr run`` of ``method``; returns its test rows and validation curve.

    A run of the same settings that was interrupted under ``out`` (a run folder
    with a checkpoint and no test results) is continued from its checkpoint;
    otherwise the run resumes from ``start`` when given (a checkpoint the
    ServerApp accepts: one a resume may continue, e.g. FedSM-extra's with fewer
    ``extra-rounds``).
    """
    settings = run_settings(method, seed, overrides)
    runs = run_folders(out, method, seed)
    interrupted = interrupted_checkpoint(runs, settings)
    if interrupted is not None:
        print(f"[compare {method} seed {seed}] continuing the interrupted run from {interrupted}", flush=True)
    elif start is not None:
        print(f"[compare {method} seed {seed}] continuing from {start}", flush=True)
    begin = interrupted or start
    folder = launch_run({**settings, **({"resume-from": str(begin.resolve())} if begin else {})}, runs,
                        f"compare {method} seed {seed}")
    with (folder / "metrics.csv").open(newline="") as handle:
        metrics = list(csv.DictReader(handle))
    score = SCORE.get(method, "dice-global")
    label = method_label(FEDERATED[method], RunConfig.from_mapping(settings))
    rows = [_row(label, seed, r["site"], float(r["value"]), settings)
            for r in metrics if r["split"] == "test" and r["metric"] == score]
    curve = [(int(r["round"]), float(r["value"])) for r in metrics
             if r["split"] == "val" and r["site"] == "pooled" and r["metric"] == score]
    return rows, curve


def _row(method: str, seed: int, site: str, value: float, settings: dict[str, object]) -> dict[str, object]:
    return {"method": method, "seed": seed, "site": site, "metric": "dice", "value": value,
            "config": json.dumps(settings, sort_keys=True)}


def run_pooled(methods: list[str], seed: int, overrides: dict[str, object],
               on_model: Callable[[str, torch.nn.Module, dict[str, SiteSplits], dict[str, dict]], None] | None = None,
               ) -> tuple[list[dict], list]:
    """Centralized and/or Local-k for one seed; returns test rows and the centralized curve.

    ``on_model(job, model, sites, per_site)``, when given, sees each trained model with the sites
    it was scored on and their test metrics (site and ``pooled`` -> metric -> value;
    ``experiments.study.run_plan`` scores every test image with it and keeps the per-case scores).
    """
    config = RunConfig.from_mapping({**overrides, "seed": seed})
    set_cpu_threads(config.torch_threads)  # more threads than free cores slows training several-fold
    info = dataset_info(config.dataset)
    sites = {name: info.load_site(i, config.image_size, config.data_scale, config.data_seed)
             for i, name in enumerate(info.site_names)}
    spec = config.model_spec(len(info.structures), info.num_sites)
    settings = centralized_settings(config, seed)
    epochs = config.num_server_rounds * config.local_epochs
    device = select_device(config.device)
    validation = {name: s.val for name, s in sites.items()}
    rows: list[dict] = []
    curve: list[tuple[int, float]] = []
    tag = {**overrides, "seed": seed, "epochs": epochs}
    jobs = (["Centralized"] if "centralized" in methods else []) + (
        [f"Local-{i + 1}" for i in range(info.num_sites)] if "local" in methods else [])
    for job in jobs:
        started = time.monotonic()
        train = concat_arrays([s.train for s in sites.values()]) if job == "Centralized" else \
            sites[info.site_names[int(job.split("-")[1]) - 1]].train
        on_epoch = (lambda e, d: curve.append((e, d))) if job == "Centralized" else None
        model = train_on_arrays(spec, train, settings, epochs, validation if on_epoch else {}, device, on_epoch,
                                pass_lr_factor(config), pass_optimizer_restart(config))
        per_site = {name: evaluate_model(model, s.test, device=device) for name, s in sites.items()}
        per_site[POOLED] = pool_site_metrics(per_site)
        if on_model is not None:
            on_model(job, model, sites, per_site)
        rows += [_row(method_label(job, config), seed, name, m["dice-global"], tag) for name, m in per_site.items()]
        print(f"[compare] {job} seed {seed}: pooled test Dice {per_site[POOLED]['dice-global']:.4f} "
              f"({time.monotonic() - started:.0f} s)", flush=True)
    return rows, curve


def load_chosen(path: Path | None, overrides: dict[str, object]) -> dict[str, dict[str, object]]:
    """Run-config overrides per method: ``overrides`` updated with ``path``'s choices.

    Centralized and Local share one entry (``centralized``), since they run
    together in one process. Every merged set is validated before any training.
    """
    choices: dict[str, dict[str, object]] = {}
    if path is not None:
        try:
            choices = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"--chosen {path}: cannot read a JSON object of per-method overrides ({error})") from error
        unknown = sorted(set(choices) - set(METHODS))
        if unknown:
            raise ValueError(f"--chosen {path}: unknown methods {unknown}; expected some of {list(METHODS)}")
    merged = {m: {**overrides, **choices.get(m, {})} for m in METHODS}
    for method, settings in merged.items():
        try:
            RunConfig.from_mapping(settings)  # fail before any training on a bad key or value
        except ValueError as error:
            raise ValueError(f"settings for {method} (--run-config and --chosen): {error}") from None
    return merged


def describe_chosen(chosen: dict[str, dict[str, object]], overrides: dict[str, object], methods: list[str]) -> str:
    """Markdown list of the settings each method ran with beyond ``--run-config``."""
    lines = ["Settings chosen on validation data:"]
    for method in methods:
        extra = {k: v for k, v in chosen[method].items() if overrides.get(k) != v}
        lines.append(f"- {method}: " + (", ".join(f"{k} = {v}" for k, v in sorted(extra.items())) or "defaults"))
    return "\n".join(lines)


def append_rows(csv_path: Path, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """Append ``rows`` (floats written with 6 decimals), the header first in a new file."""
    fresh = not csv_path.exists()
    with csv_path.open("a", newline="") as handle:
        writer = csv.writer(handle)
        if fresh:
            writer.writerow(columns)
        writer.writerows(tuple(f"{v:.6f}" if isinstance(v, float) else v for v in row) for row in rows)


def read_rows(csv_path: Path) -> list[dict[str, str]]:
    """The rows :func:`append_rows` wrote, none when the file does not exist yet."""
    if not csv_path.exists():
        return []
    with csv_path.open(newline="") as handle:
        return list(csv.DictReader(handle))
