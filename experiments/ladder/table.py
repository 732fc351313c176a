r"""The ladder's table, from its CSV alone.

Usage::

    python -m experiments.ladder.table --csv experiments/results/ladder/results.csv \
        --out experiments/results/ladder/table.md

One section per dataset; one row per (method, rung, model), means over the
seeds that row has finished (named in its ``seeds`` column): client-average and pooled test
Dice, the pooled validation Dice at five evenly spaced evaluated rounds, and the
rounds (centralized: passes) to reach centralized's best validation Dice minus
one point (:data:`experiments.study.speed_table.MARGIN`) on that seed, averaged over the seeds that reach it.
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys
from pathlib import Path

import numpy as np

from experiments.study.speed_table import MARGIN, rounds_to

POOLED = "pooled"
RUNG_ORDER = {"pooled": 0, "one-site": 1, "iid": 2, "real": 3}
Key = tuple[str, str, str]  # method, rung, model


def read_cells(csv_path: Path) -> dict[str, dict[int, dict[Key, dict[str, object]]]]:
    """``dataset -> seed -> (method, rung, model) -> {"curve": [(round, dice)], "test": {site: dice}}``."""
    cells: dict = collections.defaultdict(lambda: collections.defaultdict(dict))
    with csv_path.open() as handle:
        for row in csv.DictReader(handle):
            if row["kind"] == "seconds":
                continue
            kind, _, model = row["kind"].partition("-")
            key = (row["method"], row["rung"], model or "global")
            cell = cells[row["dataset"]][int(row["seed"])].setdefault(key, {"curve": [], "test": {}})
            if kind == "val":
                cell["curve"].append((int(row["round"]), float(row["value"])))
            else:
                cell["test"][row["site"]] = float(row["value"])
    return cells


def _at(curve: list[tuple[int, float]], server_round: int) -> float:
    values = dict(curve)
    return values.get(server_round, float("nan"))


def _mean(values: list[float]) -> str:
    kept = [v for v in values if not np.isnan(v)]
    return f"{np.mean(kept):.4f}" if kept else "-"


def section(dataset: str, by_seed: dict[int, dict[Key, dict]]) -> list[str]:
    """The markdown section of one dataset: one row per cell, averaged over the seeds that cell has finished.

    A cell's seeds are those on which both it and centralized training (its target) have
    finished; the ``seeds`` column names them, so a setting run on more seeds (a finalist)
    sits beside the one-seed grid without hiding it.
    """
    reference = ("centralized", "pooled", "global")
    seeds = sorted(s for s, cells in by_seed.items() if reference in cells)
    if not seeds:
        return [f"## {dataset}", "", "Centralized has not finished on any seed yet.", ""]
    last = max(r for cells in by_seed.values() for cell in cells.values() for r, _ in cell["curve"])
    marks = [round(last * i / 5) for i in range(1, 6)]
    lines = [f"## {dataset}", "",
             "| method | rung | model | seeds | client-average test | pooled test | "
             + " | ".join(f"val @{m}" for m in marks) + " | rounds to target |",
             "|---|---|---|---|---|---|" + "---|" * len(marks) + "---|"]
    keys = {key for s in seeds for key in by_seed[s]}
    for key in sorted(keys, key=lambda k: (k[0] != "centralized", k[0], RUNG_ORDER.get(k[1], 9), k[2])):
        have = [s for s in seeds if key in by_seed[s]]
        cells = [by_seed[s][key] for s in have]
        targets = [max(d for _, d in by_seed[s][reference]["curve"]) - MARGIN for s in have]
        reached = [rounds_to(c["curve"], t) for c, t in zip(cells, targets, strict=True)]
        hits = [r for r in reached if r is not None]
        to_target = f"{np.mean(hits):.0f}" + (f" ({len(hits)} of {len(reached)} seeds)" if len(hits) < len(reached)
                                              else "") if hits else "not reached"
        client = [np.mean([d for site, d in c["test"].items() if site != POOLED]) for c in cells]
        lines.append(f"| {' | '.join(key)} | {', '.join(map(str, have))} | {_mean(client)} | "
                     f"{_mean([c['test'][POOLED] for c in cells])} | "
                     + " | ".join(_mean([_at(c["curve"], m) for c in cells]) for m in marks) + f" | {to_target} |")
    return [*lines, "", "Means over each row's seeds. Target: centralized's best pooled validation Dice minus "
            f"{MARGIN * 100:.0f} point, on each seed.", ""]


def write_table(csv_path: Path, out: Path) -> None:
    """Write ``table.md`` from the CSV."""
    cells = read_cells(csv_path)
    lines = ["# The generalization-gap ladder", "",
             "Client-average and pooled test Dice, pooled validation Dice at evaluated rounds, and rounds to "
             "reach centralized's best validation Dice minus one point. Made by `python -m "
             "experiments.ladder.table` from `results.csv`.", ""]
    for dataset in cells:
        lines += section(dataset, cells[dataset])
    out.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    """Write the ladder's table from its CSV."""
    parser = argparse.ArgumentParser(description="The ladder's table from its CSV")
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    write_table(args.csv, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
