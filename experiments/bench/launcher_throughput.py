"""Runs per hour of a study on this machine: one ``flwr-run`` sitting against in-process sittings, one per core.

Usage::

    python -m experiments.bench.launcher_throughput --out experiments/results/bench-launcher \
        --methods fedavg fedprox --seeds 0 1 --rounds 10 --sittings 2 \
        --run-config image-size=64 dataset=synthetic-fundus-style

Writes a small study plan (the named methods and seeds on one dataset, every
run exactly ``--rounds`` rounds: the stopping rule's minimum and maximum) and
runs it twice with :mod:`experiments.study.run_plan`, each time into a fresh
folder: once as one sitting with ``--launcher flwr-run`` (``scripts/run-simulation.sh``,
a Ray simulation on every core), once as ``--sittings`` sittings with
``--launcher in-process`` started together on the same folder
(:mod:`experiments.study.job_claims` shares the runs out). It records the
wall seconds each way took for all the runs, and checks that both ways
trained the same models: every run's client-average test Dice must agree
(the apps are the same code; ``tests/test_end_to_end.py`` checks a run bit
for bit). Appends ``(label, launcher, sittings, runs, rounds, seconds,
runs_per_hour, client_average)`` rows to ``--out/throughput.csv``, one per
way and one per run's Dice. Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from experiments.runner import ROOT, append_rows, parse_overrides
from experiments.study.runs import read_rows

COLUMNS = ("label", "launcher", "sittings", "run", "rounds", "seconds", "runs_per_hour", "client_average")


def plan_text(dataset: str, methods: list[str], seeds: list[int], rounds: int,
              overrides: dict[str, object]) -> str:
    """A study plan of ``methods`` x ``seeds`` on ``dataset`` whose every run trains exactly ``rounds`` rounds."""
    config = "\n".join(f"{key} = {json.dumps(value)}" for key, value in overrides.items())
    return (f'[study]\ndatasets = ["{dataset}"]\nmethods = {methods!r}\nseeds = {seeds!r}\n'.replace("'", '"')
            + f"[stopping]\nmin-rounds = {rounds}\nmax-rounds = {rounds}\nwindow = 1\nmin-gain = 0.0\n"
            f"check-every = 1\n[run-config]\neval-every = {rounds}\n{config}\n")


def run_sittings(plan: Path, out: Path, launcher: str, sittings: int) -> float:
    """Wall seconds for ``sittings`` sittings of ``plan`` started together on ``out`` to finish every run."""
    command = [sys.executable, "-m", "experiments.study.run_plan", "--plan", str(plan), "--out", str(out),
               "--launcher", launcher]
    began = time.perf_counter()
    logs = [(out.parent / f"{out.name}-sitting{k}.log").open("w") for k in range(sittings)]
    processes = [subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
                 for log in logs]
    codes = [process.wait() for process in processes]
    seconds = time.perf_counter() - began
    for log in logs:
        log.close()
    if any(codes):
        raise RuntimeError(f"{launcher}: a sitting exited with {codes}; see {out.parent}/{out.name}-sitting*.log")
    return seconds


def client_averages(out: Path) -> dict[str, float]:
    """Each run's client-average test Dice (``method seed``), from the study's ``results.csv``."""
    tests: dict[str, list[float]] = {}
    for row in read_rows(out / "results.csv"):
        if row["kind"] == "test" and row["site"] != "pooled":
            tests.setdefault(f"{row['method']} seed {row['seed']}", []).append(float(row["value"]))
    return {run: sum(values) / len(values) for run, values in sorted(tests.items())}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns 1 when the two ways trained different models."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", default="")
    parser.add_argument("--methods", nargs="+", default=["fedavg", "fedprox"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--sittings", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--run-config", nargs="*", default=["image-size=64", "dataset=synthetic-fundus-style"])
    args = parser.parse_args(argv)
    overrides = parse_overrides(" ".join(args.run_config))
    dataset = str(overrides.pop("dataset", "synthetic-fundus"))
    scratch = args.out / "runs"
    scratch.mkdir(parents=True, exist_ok=True)
    plan = scratch / "plan.toml"
    plan.write_text(plan_text(dataset, args.methods, args.seeds, args.rounds, overrides))
    runs = len(args.methods) * len(args.seeds)
    found: dict[str, dict[str, float]] = {}
    for launcher, sittings in (("flwr-run", 1), ("in-process", args.sittings)):
        out = scratch / f"{launcher}-{time.strftime('%Y%m%d-%H%M%S')}"
        seconds = run_sittings(plan, out, launcher, sittings)
        found[launcher] = client_averages(out)
        print(f"[launchers] {launcher} x{sittings}: {runs} runs of {args.rounds} rounds in {seconds:.0f} s "
              f"({3600 * runs / seconds:.1f} runs per hour)", flush=True)
        append_rows(args.out / "throughput.csv", COLUMNS,
                    [(args.label, launcher, sittings, "all", args.rounds, f"{seconds:.1f}",
                      f"{3600 * runs / seconds:.2f}", ""),
                     *[(args.label, launcher, sittings, run, args.rounds, "", "", f"{dice:.6f}")
                       for run, dice in found[launcher].items()]])
    if found["flwr-run"] != found["in-process"]:
        print(f"[launchers] the two ways trained different models: {found}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
