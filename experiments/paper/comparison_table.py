"""Paper-style comparison tables and training curves from long-format results.

Input rows: ``method, seed, site, metric, value`` (``site`` is a site name or
``pooled``). The table has one row per method, one column per site, the client
average (mean over site columns) and the pooled ("global") Dice, each as
mean +/- std over seeds, like Table 3 of Xu et al. 2022.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

LONG_COLUMNS = ("method", "seed", "site", "metric", "value", "config")
POOLED = "pooled"


def read_long_csv(path: str | Path) -> list[dict[str, str]]:
    """Rows of a long-format results file."""
    with Path(path).open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    missing = [c for c in LONG_COLUMNS[:5] if rows and c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}; expected {list(LONG_COLUMNS)}")
    return rows


def write_long_csv(path: str | Path, rows: Iterable[Mapping[str, object]]) -> Path:
    """Write rows with the columns of :data:`LONG_COLUMNS`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=LONG_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def mean_std(values: Sequence[float]) -> str:
    """``mean ± std`` (sample std) to 4 decimals; the mean alone for one value, ``-`` for none."""
    if not values:
        return "-"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.4f}"
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{mean:.4f} ± {std:.4f}"


def comparison_table(rows: Iterable[Mapping[str, str]], sites: Sequence[str], metric: str = "dice") -> list[str]:
    """Markdown lines: methods (in first-seen order) by sites, client average and pooled.

    The client average of a seed is the mean of its site values; mean and
    sample standard deviation are then taken over seeds. A method with no
    value for a column shows ``-``.
    """
    values: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    methods: list[str] = []
    for row in rows:
        if row["metric"] != metric:
            continue
        if row["method"] not in methods:
            methods.append(row["method"])
        values[row["method"]][row["seed"]][row["site"]] = float(row["value"])
    header = ["method", *sites, "client avg", "pooled"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method in methods:
        seeds = values[method]
        cells = []
        for column in [*sites, POOLED]:
            found = [per_site[column] for per_site in seeds.values() if column in per_site]
            cells.append(mean_std(found) if found else "-")
        averages = [
            sum(per_site[s] for s in sites) / len(sites)
            for per_site in seeds.values() if all(s in per_site for s in sites)
        ]
        cells.insert(len(sites), mean_std(averages) if averages else "-")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def best_so_far(curve: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """Running maximum of ``(round, value)`` pairs, sorted by round."""
    best = -math.inf
    result = []
    for server_round, value in sorted(curve):
        best = max(best, value)
        result.append((server_round, best))
    return result


def plot_curves(
    path: str | Path,
    curves: Mapping[str, Sequence[tuple[int, float]]],
    reference: tuple[str, float] | None = None,
    ylabel: str = "best validation Dice so far",
) -> Path:
    """One line per method (best so far per round), optionally a horizontal reference line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    for name, curve in curves.items():
        points = best_so_far(curve)
        axis.plot([r for r, _ in points], [v for _, v in points], label=name)
    if reference is not None:
        axis.axhline(reference[1], color="black", linestyle="--", label=reference[0])
    axis.set_xlabel("round")
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
