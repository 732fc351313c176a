"""Run outputs: long-format metrics CSV and the Markdown summary."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fedsm_core.evaluation.case_scores import (
    CASE_DICE,
    CASE_HD95,
    CASE_HD95_MM,
    NUM_CASES,
    NUM_EMPTY_CASES,
    NUM_MISSED,
)

CSV_COLUMNS = ("round", "split", "site", "metric", "value")
POOLED = "pooled"
SUMMARY_METRICS = ("dice-global", "dice-personal", "dice-super", "dice-knn-per", "dice-super-knn", "selector-accuracy",
                   "share-global",
                   "num-empty", "empty-fp-global", "empty-fp-personal", "empty-fp-super",
                   NUM_CASES, *(prefix + model for prefix in (CASE_DICE, CASE_HD95, CASE_HD95_MM)
                                for model in ("global", "personal", "super", "knn-per", "super-knn")))
COUNT_PREFIX = "num-"  # counts add up over sites
DICE_PREFIX = "dice-"  # means over images with foreground (fedsm_core.metrics)
EMPTY_FP_PREFIX = "empty-fp-"  # means over images without foreground
CASE_LEGEND = ("`dice-*`: slice Dice (paper), the mean over 2-D slices with foreground; `case-dice-*`: per-case "
               "3-D Dice, each case's slices stacked into one volume, the mean over cases with foreground; "
               "`case-hd95-*`: per-case 95th-percentile Hausdorff distance in voxels (in-plane pixels of the "
               "resized slices, one slice step across), the mean over cases where the model found foreground "
               "(`num-missed-cases-*` in metrics.csv counts the others); `case-hd95-mm-*`: the same in mm, where "
               "every case has a voxel spacing (NIfTI headers, generated prostate cases); `num-cases`: cases "
               "(docs/results.md)")


def _images_behind(name: str, metrics: Mapping[str, float]) -> float:
    """How many of a site's images (or cases) a mean ``name`` was taken over: its weight when pooling."""
    empty = metrics.get("num-empty", 0.0)
    if name.startswith(DICE_PREFIX):
        return metrics["num-images"] - empty
    if name.startswith(EMPTY_FP_PREFIX):
        return empty
    if name.startswith(CASE_DICE):
        return metrics.get(NUM_CASES, 0.0) - metrics.get(NUM_EMPTY_CASES, 0.0)
    if name.startswith(CASE_HD95):  # voxels or mm: over the same cases
        model = name.removeprefix(CASE_HD95_MM) if name.startswith(CASE_HD95_MM) else name.removeprefix(CASE_HD95)
        missed = metrics.get(NUM_MISSED + model, 0.0)
        return metrics.get(NUM_CASES, 0.0) - metrics.get(NUM_EMPTY_CASES, 0.0) - missed
    return metrics["num-images"]


def pool_site_metrics(per_site: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Pool per-site means into per-image means over all sites.

    Every site's mean is weighted by the number of images it was taken over, so
    the result equals the mean over the pooled images (the paper's "global"
    column): ``num-images`` in general, images with foreground for Dice,
    ``num-empty`` for the empty images' false-positive rates, cases with
    foreground for per-case Dice and those with a defined HD95 for HD95
    (:mod:`fedsm_core.evaluation.case_scores`), so pooled case means are means
    over the pooled cases. Counts
    (``num-*``) add up. Metrics missing at some site are pooled over the sites
    that have them.
    """
    pooled: dict[str, float] = {}
    names = sorted({name for metrics in per_site.values() for name in metrics})
    for name in names:
        present = [m for m in per_site.values() if name in m]
        if name.startswith(COUNT_PREFIX):
            pooled[name] = float(sum(m[name] for m in present))
            continue
        pairs = [(m[name], _images_behind(name, m)) for m in present if not math.isnan(m[name])]
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
        """Write one round of per-site metrics plus their pooled values; return the pooled ones.

        A second evaluation of the same round and split replaces the first (FedSM
        validates a stopped run's last round again after fine-tuning).
        """
        pooled = pool_site_metrics(per_site)
        rows = [
            (server_round, split, site, name, value)
            for site, metrics in [*per_site.items(), (POOLED, pooled)]
            for name, value in sorted(metrics.items())
        ]
        kept = [row for row in self.rows if (int(row[0]), row[1]) != (server_round, split)]
        if len(kept) < len(self.rows):
            self.rows = kept
            with self.path.open("w", newline="") as handle:
                csv.writer(handle).writerows([CSV_COLUMNS, *kept])
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
        cells = [("-" if name not in values else f"{int(values[name])}" if name.startswith(COUNT_PREFIX)
                  else f"{values[name]:.4f}") for name in metrics]
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
        if any(NUM_CASES in values for values in per_site.values()):
            lines += ["", CASE_LEGEND]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path
