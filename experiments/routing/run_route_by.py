r"""Routing by image against routing by case: one FedSM run per cell, scored both ways, resumable.

``route-by`` only changes how the trained super model routes at evaluation (Algorithm 2
per image, or once per case from the mean selector log-probability over its slices), so
one run per cell suffices when its evaluation is repeated: each cell here is one whole
FedSM run through the real ServerApp and ClientApps in this process
(:mod:`experiments.in_process_app`) with the cell's ``route-by``, on a dataset whose
example ids name cases (``synthetic-prostate``, the NIfTI sources). It records every
site's validation and test scores of the super model: slice Dice (the paper's metric),
per-case 3-D Dice and HD95, and the share routed to the global model. The choice is
made on validation slice Dice (client average); test is reported once. Usage::

    python -m experiments.routing.run_route_by --out experiments/results/route-by --rounds 40 --seeds 0 \
        --run-config "image-size=64"

A sitting skips the cells already in ``results.csv``; an interrupted cell is trained
again. ``commands.md`` logs every sitting.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import shutil
import sys
import time
from pathlib import Path

from experiments.in_process_app import run_app
from experiments.progress import over_runs
from experiments.routing.route_by_table import COLUMNS, METRICS, write_table
from experiments.runner import parse_overrides
from experiments.sittings import MEASURED_WITH, check_cell_configs, locked, log_sitting, record_finished_cell
from fedsm_core.algorithms.fedsm.settings import ROUTE_BY
from fedsm_core.config import RunConfig

Cell = tuple[str, str, int]  # dataset, route-by, seed


def cells(datasets, routes, seeds) -> list[Cell]:
    """Every cell in order."""
    return list(itertools.product(datasets, routes, seeds))


def finished_cells(csv_path: Path) -> set[Cell]:
    """The cells with rows in the CSV."""
    if not csv_path.exists():
        return set()
    with csv_path.open() as handle:
        return {(r["dataset"], r["route_by"], int(r["seed"])) for r in csv.DictReader(handle)}


def cell_overrides(cell: Cell, rounds: int, extra: dict) -> dict[str, object]:
    """The run config of one cell: ``extra`` plus FedSM, the cell's dataset, routing and seed."""
    dataset, route_by, seed = cell
    values = {"eval-every": rounds, **MEASURED_WITH, **extra, "dataset": dataset, "strategy": "fedsm",
              "route-by": route_by, "seed": seed, "data-seed": seed, "num-server-rounds": rounds}
    RunConfig.from_mapping(values)  # every cell's settings are checked before the first one trains
    return values


def run_cell(overrides: dict[str, object], folder: Path) -> list[tuple[str, str, str, float]]:
    """Train one cell; ``(split, site, metric, value)`` rows of its last validation and its test, and its seconds."""
    shutil.rmtree(folder, ignore_errors=True)  # an interrupted cell starts again
    started = time.monotonic()
    run_app(folder, overrides)
    seconds = time.monotonic() - started
    run_folder = next(folder.iterdir())
    with (run_folder / "metrics.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["metric"] in METRICS and r["site"] != "pooled"]
    last_val = max((int(r["round"]) for r in rows if r["split"] == "val"), default=None)
    kept = [(r["split"], r["site"], r["metric"], float(r["value"])) for r in rows
            if r["split"] == "test" or (r["split"] == "val" and int(r["round"]) == last_val)]
    return [*kept, ("time", "", "seconds", seconds)]


def append_rows(csv_path: Path, cell: Cell, rows: list[tuple[str, str, str, float]],
                settings: dict[str, object]) -> None:
    """Add a finished cell's rows to the CSV and its config to ``cell-configs.jsonl``, rewrite the table (locked)."""
    record_finished_cell(csv_path, COLUMNS, cell, [(*row[:3], float(row[3])) for row in rows], settings,
                         lambda: write_table(csv_path, csv_path.parent / "table.md"))


def main(argv: list[str] | None = None) -> int:
    """Run the cells left, writing the CSV and the table after each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--datasets", nargs="+", default=["synthetic-prostate"])
    parser.add_argument("--routes", nargs="+", default=list(ROUTE_BY), choices=list(ROUTE_BY))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--run-config", default="", help='overrides, e.g. "image-size=64"')
    args = parser.parse_args(argv)
    extra = parse_overrides(args.run_config)
    todo = cells(args.datasets, args.routes, args.seeds)
    settings = {cell: cell_overrides(cell, args.rounds, extra) for cell in todo}
    csv_path = args.out / "results.csv"
    check_cell_configs(args.out, settings)
    done = finished_cells(csv_path)
    log_sitting(args.out, "experiments.routing.run_route_by", "experiments.routing.route_by_table",
                sys.argv[1:] if argv is None else argv, len(done & set(todo)), len(todo))
    for cell in over_runs([c for c in todo if c not in done], "route-by"):
        folder = args.out / "runs" / "-".join(map(str, cell))
        with locked(folder.parent / f"{folder.name}.lock", wait=False) as mine:
            if mine and cell not in finished_cells(csv_path):  # not taken, nor finished by another sitting
                append_rows(csv_path, cell, run_cell(settings[cell], folder), settings[cell])
                print(f"[route-by] {' '.join(map(str, cell))}: done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
