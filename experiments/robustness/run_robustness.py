r"""One malicious site of six against each aggregation: the honest sites' test Dice, resumable.

Each cell is one whole federated run through the real ServerApp and ClientApps
in this process (:mod:`experiments.in_process_app`): a dataset, a method, an
attack made by ``--attacked-site`` (``none``: the same run without one;
``absent``: the run without that site at all, ``held-out-site``, which is the
most a defence that left it out of every round could keep), an
``aggregation`` (``<name>+clip`` also sets ``clip-update-norm = --clip-factor``;
``filtered-mean+cosine`` sets ``filter-min-cosine = --min-cosine``;
``filtered-mean+memory`` sets ``filter-memory = true``)
and a seed. It records every site's test Dice of the deployed model (FedAvg's
global model, FedSM's super model) and the seconds per round.
The table reads the client average over the honest sites only, the attacked
site left out of every cell alike (with and without attack). Usage::

    python -m experiments.robustness.run_robustness --out experiments/results/robustness --rounds 30 --seeds 0 \
        --run-config "image-size=64"

A sitting skips the cells already in ``results.csv``; an interrupted cell is
trained again. ``commands.md`` logs every sitting.
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
from experiments.robustness.table import COLUMNS, write_table
from experiments.runner import parse_overrides
from experiments.sittings import MEASURED_WITH, check_cell_configs, locked, log_sitting, record_finished_cell
from fedsm_core.algorithms.attacks import ATTACKS, FEDSM_ONLY
from fedsm_core.algorithms.robust_aggregation import AGGREGATIONS
from fedsm_core.config import RunConfig
from fedsm_core.methods import METHODS

NONE = "none"
ABSENT = "absent"  # not an attack: the attacked site leaves the federation (held-out-site), a perfect filter's bound
CLIPPED = "+clip"  # an aggregation name with this suffix also cuts updates to --clip-factor x the median norm
DIRECTED = "filtered-mean+cosine"  # the filtered mean with its direction bound (filter-min-cosine = --min-cosine)
REMEMBERING = "filtered-mean+memory"  # the filtered mean with its memory of each site's distance ratios (filter-memory)
Cell = tuple[str, str, str, str, int]  # dataset, method, attack, aggregation, seed


def cells(datasets, methods, attacks, aggregations, seeds) -> list[Cell]:
    """Every cell in order; FedSM-only attacks only for FedSM's family."""
    return [(d, m, a, g, s) for d, m, a, g, s in itertools.product(datasets, methods, attacks, aggregations, seeds)
            if a not in FEDSM_ONLY or METHODS[m].family == "fedsm"]


def finished_cells(csv_path: Path) -> set[Cell]:
    """The cells with rows in the CSV."""
    if not csv_path.exists():
        return set()
    with csv_path.open() as handle:
        return {(r["dataset"], r["method"], r["attack"], r["aggregation"], int(r["seed"]))
                for r in csv.DictReader(handle)}


def cell_overrides(cell: Cell, rounds: int, attacked_site: str, scale: float, extra: dict,
                   clip_factor: float = 2.0, min_cosine: float = 0.0) -> dict[str, object]:
    """The run config of one cell: ``extra`` plus the cell's dataset, method, attack, aggregation and seed."""
    dataset, method, attack, aggregation, seed = cell
    plan = "" if attack in (NONE, ABSENT) else f"{attacked_site}:{attack}"
    name = "filtered-mean" if aggregation in (DIRECTED, REMEMBERING) else aggregation.removesuffix(CLIPPED)
    values = {"eval-every": rounds, **MEASURED_WITH, **extra, "dataset": dataset, "strategy": method, "seed": seed,
              "data-seed": seed, "num-server-rounds": rounds, "aggregation": name, "attack": plan,
              "attack-scale": scale, "clip-update-norm": clip_factor if aggregation.endswith(CLIPPED) else 0.0,
              "filter-min-cosine": min_cosine if aggregation == DIRECTED else -1.0,
              "filter-memory": aggregation == REMEMBERING}
    if attack == ABSENT:
        values["held-out-site"] = attacked_site
    RunConfig.from_mapping(values)  # every cell's settings are checked before the first one trains
    return values


def run_cell(cell: Cell, overrides: dict[str, object], folder: Path) -> list[tuple[str, str, float]]:
    """Train one cell; ``(kind, site, value)`` rows: each site's test Dice, and the seconds per round."""
    shutil.rmtree(folder, ignore_errors=True)  # an interrupted cell starts again
    started = time.monotonic()
    run_app(folder, overrides)
    seconds = time.monotonic() - started
    run_folder = next(folder.iterdir())
    score = METHODS[cell[1]].score
    with (run_folder / "metrics.csv").open() as handle:
        rows = [("test", r["site"], float(r["value"])) for r in csv.DictReader(handle)
                if r["split"] == "test" and r["metric"] == score and r["site"] != "pooled"]
    return [*rows, ("seconds-per-round", "", seconds / int(overrides["num-server-rounds"]))]


def append_rows(csv_path: Path, cell: Cell, rows: list[tuple[str, str, float]], attacked_site: str,
                settings: dict[str, object]) -> None:
    """Add a finished cell's rows to the CSV and its config to ``cell-configs.jsonl``, rewrite the table (locked)."""
    record_finished_cell(csv_path, COLUMNS, cell, [(kind, site, float(value)) for kind, site, value in rows],
                         settings, lambda: write_table(csv_path, csv_path.parent / "table.md", attacked_site))


def main(argv: list[str] | None = None) -> int:
    """Run the cells left, writing the CSV and the table after each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--datasets", nargs="+", default=["synthetic-fundus", "synthetic-fundus-style"])
    parser.add_argument("--methods", nargs="+", default=["fedavg", "fedsm"], choices=sorted(METHODS))
    parser.add_argument("--attacks", nargs="+", default=[NONE, *ATTACKS], choices=[NONE, ABSENT, *ATTACKS])
    parser.add_argument("--aggregations", nargs="+", default=list(AGGREGATIONS),
                        choices=[*AGGREGATIONS, *(name + CLIPPED for name in AGGREGATIONS), DIRECTED, REMEMBERING])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--attacked-site", default="site-6")
    parser.add_argument("--attack-scale", type=float, default=4.0)
    parser.add_argument("--clip-factor", type=float, default=2.0, help="clip-update-norm of '<name>+clip' cells")
    parser.add_argument("--min-cosine", type=float, default=0.0, help=f"filter-min-cosine of '{DIRECTED}' cells")
    parser.add_argument("--run-config", default="", help='overrides, e.g. "image-size=64"')
    args = parser.parse_args(argv)
    extra = parse_overrides(args.run_config)
    todo = cells(args.datasets, args.methods, args.attacks, args.aggregations, args.seeds)
    settings = {cell: cell_overrides(cell, args.rounds, args.attacked_site, args.attack_scale, extra, args.clip_factor,
                                     args.min_cosine)
                for cell in todo}
    csv_path = args.out / "results.csv"
    check_cell_configs(args.out, settings)
    done = finished_cells(csv_path)
    log_sitting(args.out, "experiments.robustness.run_robustness", "experiments.robustness.table",
                sys.argv[1:] if argv is None else argv, len(done & set(todo)), len(todo))
    for cell in over_runs([c for c in todo if c not in done], "robustness"):
        folder = args.out / "runs" / "-".join(map(str, cell)).replace("/", "_")
        with locked(folder.parent / f"{folder.name}.lock", wait=False) as mine:
            if mine and cell not in finished_cells(csv_path):  # not taken, nor finished by another sitting
                rows = run_cell(cell, settings[cell], folder)
                append_rows(csv_path, cell, rows, args.attacked_site, settings[cell])
                honest = [v for kind, site, v in rows if kind == "test" and site != args.attacked_site]
                print(f"[robustness] {' '.join(map(str, cell))}: honest client-average test Dice "
                      f"{sum(honest) / len(honest):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
