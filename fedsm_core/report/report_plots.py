"""The report's figures, drawn with matplotlib into PNG files beside ``report.html``.

Every function takes a :class:`~fedsm_core.report.run_data.RunData` and a
path, and returns the path, or ``None`` when the run has nothing to draw
(no validation round yet, no sweep, no cost logs), so the page can say so.
``matplotlib.figure.Figure`` is used without pyplot: no GUI backend and no
global figure state, which matters inside a ServerApp process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedsm_core.report.run_data import POOLED, RunData

MODELS = (("dice-global", "global", "#1f77b4"), ("dice-personal", "personalized", "#ff7f0e"),
          ("dice-super", "super", "#2ca02c"))
BASELINE_COLOUR = "#7f7f7f"
DPI = 90


def _grid(count: int, columns: int = 4) -> tuple[int, int]:
    columns = min(columns, count)
    return math.ceil(count / columns), columns


def plot_validation(run: RunData, path: Path, baseline: RunData | None = None) -> Path | None:
    """Validation Dice per evaluated round of the global, personalized and super model.

    One panel for the pooled images and one per site; a baseline run's
    ``dice-global`` (a centralized run, say) is drawn dashed in grey.
    """
    if not run.split_rounds("val"):
        return None
    panels = [POOLED, *run.site_columns]
    rows, columns = _grid(len(panels))
    figure = Figure(figsize=(3.4 * columns, 2.6 * rows), dpi=DPI)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for axis, site in zip(axes, panels, strict=False):
        for metric, label, colour in MODELS:
            rounds, values = run.curve("val", site, metric)
            if rounds:
                axis.plot(rounds, values, marker="o", markersize=3, color=colour, label=label)
        if baseline is not None:
            rounds, values = baseline.curve("val", site, "dice-global")
            if rounds:
                axis.plot(rounds, values, linestyle="--", color=BASELINE_COLOUR, label="baseline")
        axis.set_title(site, fontsize=9)
        axis.set_xlabel("round", fontsize=8)
        axis.set_ylabel("Dice", fontsize=8)
        axis.tick_params(labelsize=7)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
        axis.grid(alpha=0.3)
    for axis in axes[len(panels):]:
        axis.set_axis_off()
    axes[0].legend(fontsize=7, loc="lower right")
    return _save(figure, path)


def plot_test_bars(run: RunData, path: Path) -> Path | None:
    """Grouped bars: test Dice of each model at each site and pooled."""
    table = run.values("test")
    if not table:
        return None
    sites = [*run.site_columns, POOLED]
    present = [model for model in MODELS if any(model[0] in table.get(site, {}) for site in sites)]
    figure = Figure(figsize=(max(6.0, 1.1 * len(sites) + 2), 3.2), dpi=DPI)
    axis = figure.subplots()
    width = 0.8 / max(len(present), 1)
    positions = np.arange(len(sites))
    for offset, (metric, label, colour) in enumerate(present):
        heights = [table.get(site, {}).get(metric, float("nan")) for site in sites]
        axis.bar(positions + (offset - (len(present) - 1) / 2) * width, heights, width, label=label, color=colour)
    axis.set_xticks(positions, sites, fontsize=8)
    axis.set_ylabel("test Dice")
    axis.set_ylim(0.0, 1.0)
    axis.grid(axis="y", alpha=0.3)
    axis.legend(fontsize=8, ncols=len(present), loc="upper left")
    return _save(figure, path)


def pooled_sweep(run: RunData, metric: str = "dice-super-sweep") -> list[float]:
    """The sites' sweeps of ``metric`` pooled, each weighted by its images with foreground."""
    curves = [(np.asarray(values[metric]), run.sweep_counts.get(site, 1.0))
              for site, values in run.sweeps.items() if metric in values]
    total = sum(weight for _, weight in curves)
    if not curves or total <= 0:
        return []
    return list(sum(curve * weight for curve, weight in curves) / total)


def chosen_gamma(run: RunData) -> float | tuple[float, ...] | None:
    """The run's gamma: the last test (else validation) round's pooled ``gamma``, or the per-model tuple."""
    for split in ("test", "val"):
        table = run.values(split)
        per_site = [table[site]["gamma"] for site in run.site_columns if "gamma" in table.get(site, {})]
        if per_site:
            return per_site[0] if len(set(per_site)) == 1 else tuple(per_site)
    return None


def plot_gamma(run: RunData, path: Path, gammas: Sequence[float]) -> Path | None:
    """Validation Dice of the super model against gamma (pooled and per site), the chosen gamma marked."""
    pooled = pooled_sweep(run)
    if len(pooled) != len(gammas):
        return None
    figure = Figure(figsize=(6.4, 3.4), dpi=DPI)
    axis = figure.subplots()
    for site in run.site_columns:
        curve = run.sweeps.get(site, {}).get("dice-super-sweep")
        if curve is not None and len(curve) == len(gammas):
            axis.plot(gammas, curve, linewidth=0.8, alpha=0.6, label=site)
    axis.plot(gammas, pooled, color="black", linewidth=2.2, label=POOLED)
    gamma = chosen_gamma(run)
    for value in ([gamma] if isinstance(gamma, float) else sorted(set(gamma or ()))):
        axis.axvline(value, color="#d62728", linestyle=":", linewidth=1.5)
    if gamma is not None:
        text = f"chosen gamma {gamma:.2f}" if isinstance(gamma, float) else "chosen gamma per model"
        axis.text(0.01, 0.02, text, transform=axis.transAxes, color="#d62728", fontsize=8)
    axis.set_xlabel("gamma (selector confidence threshold)")
    axis.set_ylabel("validation Dice of the super model")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, ncols=2, loc="best")
    return _save(figure, path)


def cost_per_round(run: RunData) -> tuple[list[int], dict[str, list[float]], list[float]]:
    """Rounds, megabytes per stage (sent plus received) per round, and wall seconds per round."""
    rounds = sorted({int(row["round"]) for row in run.traffic + run.timing if int(row["round"]) > 0})
    stages = sorted({row["stage"] for row in run.traffic})
    megabytes = {stage: [sum(row["bytes"] for row in run.traffic if row["round"] == r and row["stage"] == stage) / 1e6
                         for r in rounds] for stage in stages}
    seconds = [sum(row["seconds"] for row in run.timing if row["round"] == r and row["part"] == "round")
               for r in rounds]
    return rounds, megabytes, seconds


def plot_cost(run: RunData, path: Path) -> Path | None:
    """Megabytes on the wire (stacked by stage) and wall seconds, per round."""
    rounds, megabytes, seconds = cost_per_round(run)
    if not rounds:
        return None
    figure = Figure(figsize=(9.0, 3.0), dpi=DPI)
    left, right = figure.subplots(1, 2)
    bottom = np.zeros(len(rounds))
    for stage, values in megabytes.items():
        left.bar(rounds, values, bottom=bottom, label=stage)
        bottom += np.asarray(values)
    left.set_xlabel("round")
    left.set_ylabel("MB sent + received")
    left.legend(fontsize=7)
    right.bar(rounds, seconds, color="#9467bd")
    right.set_xlabel("round")
    right.set_ylabel("wall seconds")
    for axis in (left, right):
        axis.grid(axis="y", alpha=0.3)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _save(figure, path)


def _save(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path
