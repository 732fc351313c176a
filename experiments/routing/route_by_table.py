r"""The route-by table from ``results.csv``: the super model routed per image and per case, side by side.

Usage::

    python -m experiments.routing.route_by_table --csv experiments/results/route-by/results.csv \
        --out experiments/results/route-by/table.md

For each dataset, one row per ``route-by``: client averages (the mean over sites of
each site's value, then over the seeds each cell has) of the super model's slice
Dice on validation (the choice is made there), and on test its slice Dice (the
paper's metric), per-case 3-D Dice, HD95 (voxels, over the cases where both
masks have foreground) and the share of images routed to the global model.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

COLUMNS = ("dataset", "route_by", "seed", "split", "site", "metric", "value")
METRICS = ("dice-super", "case-dice-super", "case-hd95-super", "share-global")
# (split, metric, header): the table's columns after the route.
SHOWN = (("val", "dice-super", "validation slice Dice"), ("test", "dice-super", "test slice Dice (paper)"),
         ("test", "case-dice-super", "test per-case 3-D Dice"), ("test", "case-hd95-super", "test HD95 (voxels)"),
         ("test", "share-global", "test share to global"))


def client_averages(csv_path: Path) -> dict[tuple[str, str, str, str], float]:
    """``(dataset, route_by, split, metric)`` -> the client average, mean over seeds (NaN sites left out)."""
    per_seed: dict[tuple, list[float]] = defaultdict(list)
    with csv_path.open() as handle:
        for row in csv.DictReader(handle):
            value = float(row["value"])
            if row["site"] and not math.isnan(value):
                per_seed[(row["dataset"], row["route_by"], row["split"], row["metric"], row["seed"])].append(value)
    over_seeds: dict[tuple, list[float]] = defaultdict(list)
    for (*key, _seed), values in per_seed.items():
        over_seeds[tuple(key)].append(statistics.fmean(values))
    return {key: statistics.fmean(values) for key, values in over_seeds.items()}


def seeds_of(csv_path: Path) -> dict[tuple[str, str], list[int]]:
    """``(dataset, route_by)`` -> the seeds it has."""
    seeds: dict[tuple[str, str], set[int]] = defaultdict(set)
    with csv_path.open() as handle:
        for row in csv.DictReader(handle):
            seeds[(row["dataset"], row["route_by"])].add(int(row["seed"]))
    return {key: sorted(value) for key, value in seeds.items()}


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def table_lines(csv_path: Path) -> list[str]:
    """The Markdown table, one section per dataset."""
    averages, seeds = client_averages(csv_path), seeds_of(csv_path)
    lines = ["# Routing the super model per image or per case", "",
             "Client averages of the super model's scores (mean over sites, then over seeds); the choice is made on "
             "validation slice Dice. Made by `python -m experiments.routing.route_by_table` from `results.csv`.", ""]
    for dataset in sorted({d for d, _ in seeds}):
        lines += [f"## {dataset}", "", "| route-by | seeds | " + " | ".join(h for *_, h in SHOWN) + " |",
                  "|---|---|" + "---|" * len(SHOWN)]
        for route in sorted(r for d, r in seeds if d == dataset):
            values = [_cell(averages.get((dataset, route, split, metric))) for split, metric, _ in SHOWN]
            lines.append(f"| {route} | {' '.join(map(str, seeds[(dataset, route)]))} | " + " | ".join(values) + " |")
        lines.append("")
    return lines


def write_table(csv_path: Path, out: Path) -> None:
    """Write ``table.md`` from the CSV."""
    out.write_text("\n".join(table_lines(csv_path)))


def main(argv: list[str] | None = None) -> int:
    """Write the table."""
    parser = argparse.ArgumentParser(description="The route-by table from its CSV")
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    write_table(args.csv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
