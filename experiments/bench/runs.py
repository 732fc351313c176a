"""The measured runs of :mod:`experiments.bench.run_bench`: ``flwr run`` with memory sampling, model sizes.

A ``flwr run`` goes through :func:`experiments.runner.launch_run` (the same
script as any run), with its own Flower home and local SuperLink ports so it
cannot meet another run's SuperLink, and with a marker in its environment so
that the memory sampler counts only its processes (the detached SuperLink,
the simulation and the Ray workers all inherit it).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from statistics import mean

import torch

from app_protocol import records
from experiments.bench.peak_memory import PeakMemory
from experiments.runner import launch_run
from fedsm_core.command_line.simulation_resources import plan_resources, visible_gpu_count
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import training_dataset
from fedsm_core.models.weights import get_weights
from fedsm_core.training.optimizer_state import adam_state_to_arrays
from server_app.traffic import SITE_TRAIN, TIMING_FILE, TRAFFIC_FILE, array_record_bytes

MARKER_VARIABLE = "FEDSM_BENCH_RUN"
# Local SuperLink ports of the benchmark's runs (Flower's defaults are 39091 / 39093).
LOCAL_PORTS = {"FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "39491", "FLWR_LOCAL_CONTROL_API_PORT": "39493"}


def flwr_environment(flwr_home: Path | None = None) -> dict[str, str]:
    """Environment of the benchmark's ``flwr run``s: a private Flower home and SuperLink ports.

    Values already set in the environment win, so a caller can choose other ports.
    """
    home = flwr_home or Path(tempfile.mkdtemp(prefix="fedsm-bench-flwr-"))
    return {"FLWR_HOME": str(home), **LOCAL_PORTS, **{k: os.environ[k] for k in LOCAL_PORTS if k in os.environ}}


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV file as dictionaries."""
    with Path(path).open(newline="") as handle:
        return list(csv.DictReader(handle))


def round_times(timing: list[dict[str, str]]) -> dict[str, float | list[float]]:
    """Wall times of a run from its ``timing.csv`` rows.

    Returns ``round-seconds`` and ``train-seconds`` (the training exchange),
    one per round in round order, ``site-seconds`` (per round, the seconds
    each site reported for its training message; empty from an app that does
    not report them), and ``setup-seconds``, ``test-seconds`` and
    ``server-app-seconds`` (NaN when missing).
    """
    rounds = sorted((int(r["round"]), float(r["seconds"])) for r in timing if r["part"] == "round")
    single = {r["part"]: float(r["seconds"]) for r in timing if r["part"] in ("setup", "test", "server-app")}
    train = sorted((int(r["round"]), float(r["seconds"])) for r in timing if r["part"] == "train")
    sites: dict[int, list[float]] = {}
    for r in timing:
        if r["part"] == SITE_TRAIN:
            sites.setdefault(int(r["round"]), []).append(float(r["seconds"]))
    return {"round-seconds": [seconds for _, seconds in rounds], "train-seconds": [seconds for _, seconds in train],
            "site-seconds": [sites[r] for r in sorted(sites)],
            **{f"{part}-seconds": single.get(part, float("nan")) for part in ("setup", "test", "server-app")}}


def traffic_per_site(traffic: list[dict[str, str]]) -> dict[str, dict[str, float]]:
    """Mean bytes per site and message, by ``stage/direction`` (e.g. ``train/sent``) and by round.

    Keys: ``"<stage>/<direction>"`` over all rounds, and
    ``"<stage>/<direction>/round-<r>"`` per round; each maps to
    ``{"bytes": ..., "array-bytes": ..., "messages": ...}``.
    """
    groups: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in traffic:
        key = f"{row['stage']}/{row['direction']}"
        groups[key].append(row)
        groups[f"{key}/round-{row['round']}"].append(row)
    return {key: {"bytes": mean(float(r["bytes"]) for r in rows),
                  "array-bytes": mean(float(r["array-bytes"]) for r in rows), "messages": len(rows)}
            for key, rows in sorted(groups.items())}


def pooled_test_dice(metrics: list[dict[str, str]]) -> float:
    """Pooled test Dice of the super model from a run's ``metrics.csv``."""
    values = [float(r["value"]) for r in metrics
              if r["split"] == "test" and r["site"] == "pooled" and r["metric"] == "dice-super"]
    return values[-1] if values else float("nan")


def run_flwr(settings: dict[str, object], out: Path, label: str, environment: dict[str, str]) -> dict[str, object]:
    """One ``flwr run`` of ``settings``; wall time, peak memory, round times and traffic from its run folder."""
    tag = f"{label}-{uuid.uuid4().hex[:8]}"
    env = {**environment, MARKER_VARIABLE: tag}
    started = time.monotonic()
    with PeakMemory(interval=0.5, marker=f"{MARKER_VARIABLE}={tag}") as peak:
        folder = launch_run(settings, out / "runs" / label, label, env=env)
    wall = time.monotonic() - started
    times = round_times(read_csv(folder / TIMING_FILE))
    sites = training_dataset(str(settings.get("dataset", "synthetic-fundus"))).num_sites
    return {
        "label": label, "settings": settings, "folder": str(folder), "sites": sites,
        "wall-seconds": wall, "peak-rss-gib": peak.gib, "processes-at-peak": peak.processes, **times,
        "peak-pss-gib": peak.pss_gib, "memory-at-peak": [dataclasses.asdict(p) for p in peak.at_peak],
        "workers": client_workers(sites, env),  # launch_run gives the run one SuperNode per site
        "start-up-seconds": wall - sum(times["round-seconds"]),
        "traffic": traffic_per_site(read_csv(folder / TRAFFIC_FILE)),
        "test-dice-super": pooled_test_dice(read_csv(folder / "metrics.csv")),
    }


def client_workers(num_supernodes: int, environment: dict[str, str]) -> int:
    """Ray ClientApp workers of a run: what ``scripts/run-simulation.sh`` plans from the same variables.

    The script asks :func:`~fedsm_core.command_line.simulation_resources.plan_resources`
    with ``RAY_CPUS`` (default: the usable cores), ``CLIENT_CPUS`` (1) and
    ``CLIENT_GPUS`` (auto); ``environment`` wins over this process's.
    """
    env = {**os.environ, **environment}
    plan = plan_resources(num_supernodes, int(env.get("RAY_CPUS", len(os.sched_getaffinity(0)))),
                          int(env.get("CLIENT_CPUS", 1)), env.get("CLIENT_GPUS", "auto"), visible_gpu_count()[0])
    return plan.concurrent_clients


def model_bytes(settings: dict[str, object]) -> dict[str, int]:
    """Serialized sizes (as :mod:`server_app.traffic` counts them) of one U-Net and of the selector.

    ``moments`` is the selector's Adam state as the app sends it: two moments
    per parameter and a step count.
    """
    config = RunConfig.from_mapping(settings)
    info = training_dataset(config.dataset, config.held_out_site)
    spec = config.model_spec(len(info.structures), info.num_sites)
    selector = spec.build_selector()
    moments = adam_state_to_arrays(selector, torch.optim.Adam(selector.parameters()))
    return {
        "model": array_record_bytes(records.to_record(get_weights(spec.build_segmentation()))),
        "selector": array_record_bytes(records.to_record(get_weights(selector))),
        "moments": array_record_bytes(records.to_record(moments)),
        "sites": info.num_sites,
    }
