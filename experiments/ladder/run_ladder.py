r"""The generalization-gap ladder: where federated training loses to pooled training.

Usage (resumable: finished cells are read from the CSV, an interrupted cell
continues from its last checkpoint)::

    python -m experiments.ladder.run_ladder --out experiments/results/ladder --seeds 0 --rounds 100 \
        --datasets synthetic-fundus-style synthetic-fundus experiments/federations/drishti-six-site.toml \
        --methods fedavg fedsm

A setting to compare is a variant: its cells are named ``<method>:<name>`` and
sit in the same CSV beside the plain method and the one centralized reference::

    python -m experiments.ladder.run_ladder --out experiments/results/ladder --seeds 0 --rounds 100 \
        --datasets synthetic-fundus-style --methods fedavg --rungs real \
        --variant local-adam --variant-config "optimizer-state='local'"

A variant of a setting centralized training reads as well (an augmentation,
say) also trains ``centralized:<name>`` with ``--centralized-variant``; plain
centralized stays every variant's reference.

Several sittings may share one ``--out`` at once (one per free core): a cell
is locked while it trains, and each sitting skips cells another holds.

For each dataset and seed it trains centralized (one Adam over all passes of
the pooled training images), then each method (FedAvg, FedProx, SCAFFOLD or
FedSM) on three partitions of the same
training images (:mod:`fedsm_core.data.repartition`): ``one-site`` (the round
protocol alone), ``iid`` (averaging sites that do not differ) and ``real``
(averaging plus heterogeneity). Every cell is scored on the real sites' own
validation and test splits. The loops run in this process on the core
functions the apps call (:mod:`experiments.ladder.loops`), without Flower.

Writes to ``--out``: ``results.csv`` (long format: dataset, method, rung, seed,
kind, round, site, value; kinds ``val`` (pooled validation Dice of the
deployed-model candidates per evaluated round), ``test`` (per-site and pooled
test Dice), ``seconds``), ``table.md`` (:mod:`experiments.ladder.table`) and
``commands.md``; cell checkpoints go to ``runs/`` (ignored by git).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from experiments.ladder.loops import CellResult, run_cell
from experiments.ladder.table import write_table
from experiments.progress import over_runs
from experiments.runner import parse_overrides
from experiments.sittings import MEASURED_WITH, check_cell_configs, locked, log_sitting, record_finished_cell
from fedsm_core.config import RunConfig
from fedsm_core.data.repartition import PARTITIONS

COLUMNS = ("dataset", "method", "rung", "seed", "kind", "round", "site", "value")
METHODS = ("fedavg", "fedprox", "scaffold", "fedsm")
CENTRALIZED = "centralized"


def cells(datasets: list[str], methods: list[str], seeds: list[int],
          rungs: tuple[str, ...] | list[str] = tuple(PARTITIONS), variant: str = "",
          centralized_variant: bool = False) -> list[tuple[str, str, str, int]]:
    """``(dataset, method, rung, seed)`` in run order: centralized first, then each method's rungs.

    A ``variant``'s cells are named ``<method>:<variant>``. Plain centralized is
    the reference of every variant; with ``centralized_variant`` (a variant
    that changes centralized training too, such as an augmentation) centralized
    also runs as ``centralized:<variant>``.
    """
    order = []
    for dataset in datasets:
        for seed in seeds:
            order.append((dataset, CENTRALIZED, "pooled", seed))
            if variant and centralized_variant:
                order.append((dataset, f"{CENTRALIZED}:{variant}", "pooled", seed))
            order += [(dataset, f"{method}:{variant}" if variant else method, rung, seed)
                      for method in methods for rung in rungs]
    return order


def finished_cells(csv_path: Path) -> set[tuple[str, str, str, int]]:
    """The cells whose ``seconds`` row is in the CSV (it is written last)."""
    if not csv_path.exists():
        return set()
    with csv_path.open() as handle:
        return {(r["dataset"], r["method"], r["rung"], int(r["seed"])) for r in csv.DictReader(handle)
                if r["kind"] == "seconds"}


def append_rows(csv_path: Path, cell: tuple[str, str, str, int], result: CellResult,
                config: RunConfig) -> None:
    """Add one finished cell's rows to the CSV (the header on first write) and its config, under the folder's lock."""
    rows = [(kind, server_round, site, float(value)) for kind, server_round, site, value in result.rows()]
    record_finished_cell(csv_path, COLUMNS, cell, rows, config.to_mapping(),
                         lambda: write_table(csv_path, csv_path.parent / "table.md"))


def cell_config(dataset: str, seed: int, rounds: int, overrides: dict[str, object], method: str) -> RunConfig:
    """The run config of one cell: ``overrides`` plus dataset, seed (also the data seed) and rounds."""
    base = method.split(":")[0]
    strategy = "fedavg" if base == CENTRALIZED else base  # centralized reads only the training settings
    return RunConfig.from_mapping({"eval-every": 5, **MEASURED_WITH, **overrides, "dataset": dataset, "seed": seed,
                                   "data-seed": seed, "num-server-rounds": rounds, "strategy": strategy})


def main(argv: list[str] | None = None) -> int:
    """Run the cells left, writing the CSV and the table after each.

    Several sittings may share ``--out`` at once (one per core, say): each
    takes a cell's lock before training it and skips cells another holds.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--rungs", nargs="+", choices=PARTITIONS, default=list(PARTITIONS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=100, help="rounds (centralized: passes) per cell")
    parser.add_argument("--run-config", default="", help='overrides of every cell, e.g. "lr=0.002 image-size=64"')
    parser.add_argument("--variant", default="", help="a name for --variant-config: its cells are <method>:<name>")
    parser.add_argument("--variant-config", default="",
                        help='what the variant changes, e.g. "optimizer-state=\'local\'"')
    parser.add_argument("--centralized-variant", action="store_true",
                        help="also train centralized with the variant (for settings centralized training reads)")
    args = parser.parse_args(argv)
    if bool(args.variant) != bool(args.variant_config):
        parser.error("--variant and --variant-config go together")
    overrides = parse_overrides(args.run_config)
    variant = {**overrides, **parse_overrides(args.variant_config)}
    for dataset in args.datasets:  # every setting is checked before any training
        for method in args.methods:
            cell_config(dataset, args.seeds[0], args.rounds, variant, method)
    csv_path = args.out / "results.csv"
    todo = cells(args.datasets, args.methods, args.seeds, args.rungs, args.variant, args.centralized_variant)
    settings = {cell: variant if cell[1] != CENTRALIZED else overrides for cell in todo}
    check_cell_configs(args.out, {cell: cell_config(cell[0], cell[3], args.rounds, settings[cell], cell[1]).to_mapping()
                                  for cell in todo})
    done = finished_cells(csv_path)
    args.out.mkdir(parents=True, exist_ok=True)
    log_sitting(args.out, "experiments.ladder.run_ladder", "experiments.ladder.table",
                sys.argv[1:] if argv is None else argv, len(done & set(todo)), len(todo))
    left = [cell for cell in todo if cell not in done]
    for cell in over_runs(left, "ladder", total=len(todo), done=len(todo) - len(left)):
        folder = cell_folder(args.out, cell)
        with locked(folder.parent / f"{folder.name}.lock", wait=False) as mine:
            if mine and cell not in finished_cells(csv_path):  # not taken, nor finished by another sitting
                run_one(cell, settings[cell], args.rounds, folder, csv_path)
    return 0


def cell_folder(out: Path, cell: tuple[str, str, str, int]) -> Path:
    """Where a cell keeps its checkpoint; its lock is this name plus ``.lock`` (a dataset path holds a dot)."""
    return out / "runs" / "-".join(map(str, cell)).replace("/", "_")


def run_one(cell: tuple[str, str, str, int], overrides: dict[str, object], rounds: int, folder: Path,
            csv_path: Path) -> None:
    """Train, score and record one cell."""
    dataset, method, rung, seed = cell
    started = time.monotonic()
    config = cell_config(dataset, seed, rounds, overrides, method)
    result = run_cell(config, method.split(":")[0], rung, folder)
    append_rows(csv_path, cell, result, config)
    print(f"[ladder] {dataset} {method} {rung} seed {seed}: client-average test Dice "
          f"{result.client_average():.4f} ({time.monotonic() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
