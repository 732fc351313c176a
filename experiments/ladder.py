"""The generalization-gap ladder: where federated training loses to pooled training.

Usage (resumable: finished cells are read from the CSV, an interrupted cell
continues from its last checkpoint)::

    python -m experiments.ladder --out experiments/results/ladder --seeds 0 --rounds 100 \\
        --datasets synthetic-fundus-style synthetic-fundus experiments/federations/drishti-six-site.toml \\
        --methods fedavg fedsm

For each dataset and seed it trains centralized (one Adam over all passes of
the pooled training images), then each method on three partitions of the same
training images (:mod:`fedsm_core.data.repartition`): ``one-site`` (the round
protocol alone), ``iid`` (averaging sites that do not differ) and ``real``
(averaging plus heterogeneity). Every cell is scored on the real sites' own
validation and test splits. The loops run in this process on the core
functions the apps call (:mod:`experiments.ladder_loops`), without Flower.

Writes to ``--out``: ``results.csv`` (long format: dataset, method, rung, seed,
kind, round, site, value; kinds ``val`` (pooled validation Dice of the
deployed-model candidates per evaluated round), ``test`` (per-site and pooled
test Dice), ``seconds``), ``table.md`` (:mod:`experiments.ladder_table`) and
``commands.md``; cell checkpoints go to ``runs/`` (ignored by git).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

from experiments.compare import parse_overrides
from experiments.ladder_loops import CellResult, run_cell
from experiments.ladder_table import write_table
from experiments.progress import over_runs
from fedsm_core.config import RunConfig
from fedsm_core.data.repartition import PARTITIONS

COLUMNS = ("dataset", "method", "rung", "seed", "kind", "round", "site", "value")
METHODS = ("fedavg", "fedsm")
CENTRALIZED = "centralized"


def cells(datasets: list[str], methods: list[str], seeds: list[int]) -> list[tuple[str, str, str, int]]:
    """``(dataset, method, rung, seed)`` in run order: centralized first, then each method's rungs."""
    order = []
    for dataset in datasets:
        for seed in seeds:
            order.append((dataset, CENTRALIZED, "pooled", seed))
            order += [(dataset, method, rung, seed) for method in methods for rung in PARTITIONS]
    return order


def finished_cells(csv_path: Path) -> set[tuple[str, str, str, int]]:
    """The cells whose ``seconds`` row is in the CSV (it is written last)."""
    if not csv_path.exists():
        return set()
    with csv_path.open() as handle:
        return {(r["dataset"], r["method"], r["rung"], int(r["seed"])) for r in csv.DictReader(handle)
                if r["kind"] == "seconds"}


def append_rows(csv_path: Path, cell: tuple[str, str, str, int], result: CellResult) -> None:
    """Add one finished cell's rows to the CSV (the header on first write)."""
    fresh = not csv_path.exists()
    dataset, method, rung, seed = cell
    with csv_path.open("a", newline="") as handle:
        writer = csv.writer(handle)
        if fresh:
            writer.writerow(COLUMNS)
        for kind, server_round, site, value in result.rows():
            writer.writerow((dataset, method, rung, seed, kind, server_round, site, f"{value:.6f}"))


def cell_config(dataset: str, seed: int, rounds: int, overrides: dict[str, object], method: str) -> RunConfig:
    """The run config of one cell: ``overrides`` plus dataset, seed (also the data seed) and rounds."""
    strategy = "fedsm" if method == "fedsm" else "fedavg"
    return RunConfig.from_mapping({"eval-every": 5, **overrides, "dataset": dataset, "seed": seed,
                                   "data-seed": seed, "num-server-rounds": rounds, "strategy": strategy})


def log_sitting(out: Path, argv: list[str], done: int, total: int) -> None:
    """Append this sitting and its command to ``commands.md`` (versions on the first write)."""
    path = out / "commands.md"
    if not path.exists():
        path.write_text("# Commands\n\nRun, or continue after an interruption (finished cells are skipped):\n\n"
                        f"    python -m experiments.ladder {' '.join(argv)}\n\nThe table from the CSV alone:\n\n"
                        f"    python -m experiments.ladder_table --csv {out}/results.csv --out {out}/table.md\n\n"
                        "## Versions\n\n"
                        f"- python {platform.python_version()}\n- torch {torch.__version__}\n"
                        f"- flwr {metadata.version('flwr')}\n\n## Sittings\n\n")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with path.open("a") as handle:
        handle.write(f"- {stamp}, commit {commit}: {done} of {total} cells finished at the start; "
                     f"`{' '.join(argv)}`\n")


def main(argv: list[str] | None = None) -> int:
    """Run the cells left, writing the CSV and the table after each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=100, help="rounds (centralized: passes) per cell")
    parser.add_argument("--run-config", default="", help='overrides, e.g. "lr=0.002 image-size=64"')
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.run_config)
    for dataset in args.datasets:  # every setting is checked before any training
        cell_config(dataset, args.seeds[0], args.rounds, overrides, "fedsm")
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "results.csv"
    todo = cells(args.datasets, args.methods, args.seeds)
    done = finished_cells(csv_path)
    log_sitting(args.out, sys.argv[1:] if argv is None else argv, len(done & set(todo)), len(todo))
    left = [cell for cell in todo if cell not in done]
    for cell in over_runs(left, "ladder", total=len(todo), done=len(todo) - len(left)):
        dataset, method, rung, seed = cell
        started = time.monotonic()
        config = cell_config(dataset, seed, args.rounds, overrides, method)
        result = run_cell(config, method, rung, args.out / "runs" / "-".join(map(str, cell)).replace("/", "_"))
        append_rows(csv_path, cell, result)
        write_table(csv_path, args.out / "table.md")
        print(f"[ladder] {dataset} {method} {rung} seed {seed}: client-average test Dice "
              f"{result.client_average():.4f} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
