"""The measurements of ``scripts/gpu-check.sh`` on a machine with a CUDA GPU.

Usage::

    python -m experiments.gpu.check --out results/gpu-check [--tests-status N --tests-summary "..."]

Parts (``--parts``, both by default):

``simulation``
    a 3-round, six-site FedSM simulation at 256 px through
    ``scripts/run-simulation.sh`` (``CLIENT_GPUS=auto``, ``precision=auto``),
    sampled with ``nvidia-smi``: seconds per round, training images per second,
    peak GPU memory per process and the share of time each GPU was busy during
    the training exchanges (:mod:`experiments.gpu.sampling`);
``agreement``
    one FedSM round on the CPU and on the GPU from the same seeds in fp32, the
    updates compared per model within a stated tolerance
    (:mod:`experiments.bench.device_agreement`).

Writes ``results.json`` and ``report.md`` (:mod:`experiments.gpu.report`) to
``--out`` after each part. Exits 1 when a part fails, the models disagree or
the tests (whose status the script passes in) failed; 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from experiments.bench.device_agreement import ROUND_SETTINGS, compare_devices, summation_order_floor, tolerance_for
from experiments.bench.runs import flwr_environment, read_csv, round_times
from experiments.gpu.report import write_report
from experiments.gpu.sampling import GpuSampler, busy_share, peak_memory_per_process
from experiments.runner import launch_run
from fedsm_core.command_line.simulation_resources import plan_resources, visible_gpu_count
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import training_dataset
from server_app.traffic import TIMING_FILE

PARTS = ("simulation", "agreement")
SIMULATION_SETTINGS = {"dataset": "synthetic-fundus", "image-size": 256, "num-server-rounds": 3,
                       "precision": "auto", "device": "auto"}


def environment() -> dict[str, object]:
    """GPU names and library versions."""
    return {"gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}


def train_images_per_round(settings: dict[str, object]) -> int:
    """Training images all sites see in one round (every image once per local epoch, or the step limit)."""
    config = RunConfig.from_mapping(settings)
    info = training_dataset(config.dataset, config.held_out_site)
    total = 0
    for index in range(info.num_sites):
        count = len(info.load_site(index, config.image_size, config.data_scale, config.data_seed).train.images)
        limit = config.max_local_steps * config.batch_size if config.max_local_steps else count * config.local_epochs
        total += min(count * config.local_epochs, limit)
    return total


def simulation_part(out: Path) -> dict[str, object]:
    """The 256 px simulation under ``nvidia-smi`` sampling."""
    env = {**flwr_environment(), "CLIENT_GPUS": os.environ.get("CLIENT_GPUS", "auto")}
    visible, _ = visible_gpu_count()
    plan = plan_resources(6, int(os.environ.get("RAY_CPUS", len(os.sched_getaffinity(0)))),
                          int(os.environ.get("CLIENT_CPUS", "1")), env["CLIENT_GPUS"], visible)
    started = time.monotonic()
    with GpuSampler(interval=0.25) as sampler:
        folder = launch_run(SIMULATION_SETTINGS, out / "runs", "gpu-check simulation", env=env)
    timing = read_csv(folder / TIMING_FILE)
    windows = [(float(r["ended"]) - float(r["seconds"]), float(r["ended"])) for r in timing if r["part"] == "train"]
    peaks = peak_memory_per_process(sampler.processes)
    return {
        "overrides": " ".join(f"{k}={v}" for k, v in SIMULATION_SETTINGS.items()), "folder": str(folder),
        "client-gpu-share": plan.client_gpus, "wall-seconds": time.monotonic() - started,
        **round_times(timing), "train-images-per-round": train_images_per_round(SIMULATION_SETTINGS),
        "busy-share": busy_share(sampler.gpus, windows), "samples": len(sampler.gpus),
        "peak-memory-mib": {f"{pid} {sampler.names.get(pid, '?')}": mib for pid, mib in peaks.items()},
    }


def agreement_part() -> dict[str, object]:
    """One FedSM round on CPU and GPU; per-model update differences against the CPU's summation-order floor."""
    floor = summation_order_floor()
    tolerance = tolerance_for(floor)
    models = compare_devices("cpu", "cuda", tolerance=tolerance)
    return {"tolerance": tolerance, "floor": floor, "settings": ROUND_SETTINGS,
            "models": [{"model": m.model, "update-norm": m.update_norm, "difference-norm": m.difference_norm,
                        "relative": m.relative, "max-abs": m.max_abs_difference, "agrees": m.agrees} for m in models]}


def failed(results: dict) -> list[str]:
    """What went wrong, for the exit status: failed tests, a failed part, disagreeing models."""
    problems = []
    if results.get("tests", {}).get("status", 0) not in (0, None):
        problems.append("gpu tests failed")
    for part in PARTS:
        if "error" in results.get(part, {}):
            problems.append(f"{part} failed")
    if any(not m["agrees"] for m in results.get("agreement", {}).get("models", [])):
        problems.append("CPU and GPU rounds disagree")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results") / "gpu-check")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--tests-status", type=int, default=None, help="exit status of the gpu-marked tests")
    parser.add_argument("--tests-summary", default="", help="pytest's last line for those tests")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {"environment": environment(), "command": shlex.join(sys.argv)}
    if args.tests_status is not None:
        results["tests"] = {"status": args.tests_status, "summary": args.tests_summary}
    for part, run in (("simulation", lambda: simulation_part(args.out.resolve())), ("agreement", agreement_part)):
        if part not in args.parts:
            continue
        print(f"[gpu-check] {part} ...", flush=True)
        try:
            results[part] = run()
        except Exception as error:  # noqa: BLE001 - the report says what failed; the other part still runs
            results[part] = {"error": f"{type(error).__name__}: {str(error)[-1500:]}"}
        (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
        write_report(args.out / "report.md", results)
    print((args.out / "report.md").read_text())
    problems = failed(results)
    if problems:
        print(f"gpu-check: {'; '.join(problems)}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
