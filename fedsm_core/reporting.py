"""Run outputs: long-format metrics CSV and the Markdown summary."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

CSV_COLUMNS = ("round", "split", "site", "metric", "value")
POOLED = "pooled"
SUMMARY_METRICS = ("dice-global", "dice-personal", "dice-super", "selector-accuracy", "share-global")


def pool_site_metrics(per_site: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Pool per-site means into per-image means over all sites.

    Every site's mean is weighted by its ``num-images``, so the result equals the
    mean over the pooled images (the paper's "global" column). Metrics missing at
    some site are pooled over the sites that have them.
    """
    pooled: dict[str, float] = {}
    names = sorted({name for metrics in per_site.values() for name in metrics if name != "num-images"})
    for name in names:
        pairs = [(m[name], m["num-images"]) for m in per_site.values() if name in m and not math.isnan(m[name])]
        total = sum(count for _, count in pairs)
        if total > 0:
            pooled[name] = sum(value * count for value, count in pairs) / total
    pooled["num-images"] = float(sum(m["num-images"] for m in per_site.values()))
    return pooled


class MetricsLog:
    """Appends long-format rows ``(round, split, site, metric, value)`` to a CSV file.

    Rows are flushed after every call so a long run can be watched (and a crashed
    one still has its history).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: list[tuple] = []
        with self.path.open("w", newline="") as handle:
            csv.writer(handle).writerow(CSV_COLUMNS)

    def extend(self, rows: Sequence[Sequence[object]]) -> None:
        """Append rows as they are (the history of an interrupted run, when resuming)."""
        rows = [tuple(row) for row in rows]
        self.rows += rows
        with self.path.open("a", newline="") as handle:
            csv.writer(handle).writerows(rows)

    def add(self, server_round: int, split: str, per_site: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
        """Write one round of per-site metrics plus their pooled values; return the pooled ones."""
        pooled = pool_site_metrics(per_site)
        rows = [
            (server_round, split, site, name, value)
            for site, metrics in [*per_site.items(), (POOLED, pooled)]
            for name, value in sorted(metrics.items())
        ]
        self.extend(rows)
        return pooled


def format_table(
    per_site: Mapping[str, Mapping[str, float]], metrics: Sequence[str] = SUMMARY_METRICS
) -> list[str]:
    """Markdown rows: one per site plus ``pooled``, one column per metric any site reported."""
    metrics = [name for name in metrics if any(name in values for values in per_site.values())]
    pooled = pool_site_metrics(per_site)
    lines = ["| site | images | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 2) + "|"]
    for site, values in [*per_site.items(), (POOLED, pooled)]:
        cells = [f"{values[name]:.4f}" if name in values else "-" for name in metrics]
        lines.append(f"| {site} | {int(values.get('num-images', 0))} | " + " | ".join(cells) + " |")
    return lines


def write_summary(
    path: str | Path,
    title: str,
    settings: Mapping[str, object],
    sections: Iterable[tuple[str, Mapping[str, Mapping[str, float]]]],
    notes: Sequence[str] = (),
) -> Path:
    """Write the run summary: settings, then one metrics table per section."""
    lines = [f"# {title}", ""]
    lines += [f"- {line}" for line in notes]
    lines += ["", "## Settings", "", "| key | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in settings.items()]
    for heading, per_site in sections:
        lines += ["", f"## {heading}", "", *format_table(per_site)]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path
