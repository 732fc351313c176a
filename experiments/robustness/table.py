r"""The robustness table and plot from ``results.csv``: honest sites' test Dice per attack and aggregation.

Usage::

    python -m experiments.robustness.table --csv experiments/results/robustness/results.csv \
        --out experiments/results/robustness/table.md

For each dataset and method: the client average of the test Dice over the
honest sites (every site but the attacked one, in every cell alike), mean over
the seeds each cell has, one row per attack and one column per aggregation; in
brackets the change from the run without attack under the mean, in Dice points.
Then the cost of each aggregation without attack: its Dice change (over the
honest sites, and over every site: without attack the attacked site is honest
too, and a filter that left it out would cost it most) and its seconds per
round against the mean. ``plot.png`` beside the table shows the
same numbers as bars.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

COLUMNS = ("dataset", "method", "attack", "aggregation", "seed", "kind", "site", "value")
Key = tuple[str, str, str, str]  # dataset, method, attack, aggregation


def honest_scores(csv_path: Path, attacked_site: str | None) -> tuple[dict[Key, dict[int, float]],
                                                                     dict[Key, list[float]]]:
    """Per cell: the honest sites' client-average test Dice by seed, and the seconds per round.

    With ``attacked_site = None`` every site counts.
    """
    per_seed: dict[tuple[Key, int], list[float]] = defaultdict(list)
    seconds: dict[Key, list[float]] = defaultdict(list)
    with csv_path.open() as handle:
        for row in csv.DictReader(handle):
            key = (row["dataset"], row["method"], row["attack"], row["aggregation"])
            if row["kind"] == "test" and row["site"] != attacked_site:
                per_seed[(key, int(row["seed"]))].append(float(row["value"]))
            elif row["kind"] == "seconds-per-round":
                seconds[key].append(float(row["value"]))
    dice: dict[Key, dict[int, float]] = defaultdict(dict)
    for (key, seed), values in sorted(per_seed.items()):
        dice[key][seed] = statistics.mean(values)
    return dict(dice), dict(seconds)


def change_points(values: dict[int, float], base: dict[int, float] | None) -> float | None:
    """Mean over the seeds both cells have of ``value - base``, in Dice points; None without a shared seed.

    Pairing by seed keeps a cell with fewer seeds from being measured against a
    baseline averaged over other seeds (seed-to-seed spread is larger than some effects).
    """
    shared = sorted(set(values) & set(base or {}))
    if not shared:
        return None
    return 100 * statistics.mean(values[seed] - base[seed] for seed in shared)


def table_lines(dice: dict[Key, dict[int, float]], seconds: dict[Key, list[float]],
                every_site: dict[Key, dict[int, float]] | None = None) -> list[str]:
    """The markdown sections, one per dataset and method; ``every_site``: the client average over all sites."""
    every_site = every_site or {}
    lines = []
    for dataset, method in sorted({key[:2] for key in dice}):
        keys = [key for key in dice if key[:2] == (dataset, method)]
        attacks = sorted({key[2] for key in keys}, key=lambda a: (a != "none", a))
        aggregations = sorted({key[3] for key in keys}, key=lambda g: (g != "mean", g))
        base = dice.get((dataset, method, "none", "mean"))
        lines += [f"## {dataset}, {method}", "", "| attack | " + " | ".join(aggregations) + " |",
                  "|---|" + "---|" * len(aggregations)]
        for attack in attacks:
            cells = [_cell(dice.get((dataset, method, attack, g)), base) for g in aggregations]
            lines.append(f"| {attack} | " + " | ".join(cells) + " |")
        lines += ["", "Without attack, against the mean (on the seeds both have):", "", "| aggregation | Dice change "
                  "(points) | every site's change | seconds per round | seconds against the mean |",
                  "|---|---|---|---|---|"]
        mean_seconds = seconds.get((dataset, method, "none", "mean"))
        for g in aggregations:
            key = (dataset, method, "none", g)
            change = change_points(dice[key], base) if key in dice else None
            if change is not None and key in seconds and mean_seconds:
                ratio = statistics.mean(seconds[key]) / statistics.mean(mean_seconds)
                everyone = change_points(every_site.get(key, {}), every_site.get((dataset, method, "none", "mean")))
                shown = "-" if everyone is None else f"{everyone:+.2f}"
                lines.append(f"| {g} | {change:+.2f} | {shown} | {statistics.mean(seconds[key]):.1f} | {ratio:.2f}x |")
        lines.append("")
    return lines


def _cell(values: dict[int, float] | None, base: dict[int, float] | None) -> str:
    if not values:
        return "-"
    change = change_points(values, base)
    shown = f"{statistics.mean(values.values()):.4f}" + (f" ({change:+.1f})" if change is not None else "")
    return shown + (f", seeds {', '.join(map(str, sorted(values)))}" if set(values) != {0} else "")


def write_table(csv_path: Path, out: Path, attacked_site: str = "site-6") -> Path:
    """Write ``out`` (markdown) and ``plot.png`` beside it."""
    dice, seconds = honest_scores(csv_path, attacked_site)
    header = ["# Robustness: one malicious site of six", "",
              f"Client-average test Dice of the honest sites (all but {attacked_site}), mean over each cell's "
              "seeds (seed 0 unless named); in brackets the change from the run "
              "without attack under the mean on the same seeds, in Dice points. "
              "Made by `python -m experiments.robustness.table` from `results.csv`.", "",
              "Columns are `run_robustness` aggregations: `filtered-mean` is each round judged on its own "
              "(`filter-memory = false`), `filtered-mean+cosine` adds the direction bound, `filtered-mean+memory` "
              "the memory of each site's distance ratios (`filter-memory = true`, the default), `<name>+clip` "
              "adds `clip-update-norm`. The row `absent` is no attack but the run without the attacked site "
              "(`held-out-site`): the most a defence that left it out of every round could keep.", ""]
    every_site, _ = honest_scores(csv_path, None)
    out.write_text("\n".join(header + table_lines(dice, seconds, every_site)))
    _plot(dice, out.parent / "plot.png")
    return out


def _plot(dice: dict[Key, dict[int, float]], path: Path) -> None:
    groups = sorted({key[:2] for key in dice})
    figure, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for axis, (dataset, method) in zip(axes[0], groups, strict=True):
        keys = [key for key in dice if key[:2] == (dataset, method)]
        attacks = sorted({key[2] for key in keys}, key=lambda a: (a != "none", a))
        aggregations = sorted({key[3] for key in keys}, key=lambda g: (g != "mean", g))
        width = 0.8 / len(aggregations)
        for index, g in enumerate(aggregations):
            heights = [statistics.mean(dice.get((dataset, method, a, g), {0: float("nan")}).values())
                       for a in attacks]
            axis.bar([i + index * width for i in range(len(attacks))], heights, width, label=g)
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(attacks))], attacks, rotation=30, ha="right")
        axis.set_title(f"{dataset}, {method}")
        axis.set_ylabel("honest sites' test Dice")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Write the table and plot from the CSV."""
    parser = argparse.ArgumentParser(description="The robustness table from its CSV")
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--attacked-site", default="site-6")
    args = parser.parse_args(argv)
    print(f"wrote {write_table(args.csv, args.out, args.attacked_site)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
