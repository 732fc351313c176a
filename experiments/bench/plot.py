"""The scaling plot of :mod:`experiments.bench.run_bench`: round time and peak memory against the number of sites.

Takes the same plain run dictionaries as :mod:`experiments.bench.report`, so
the plot can be redrawn from ``results.json`` and tested on hand-made values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import mean

SCALING_PLOT = "scaling.png"


def sites_series(runs: Sequence[Mapping[str, object]], image_size: int) -> dict[str, list[float]]:
    """``sites``, ``round-seconds`` (mean per run), ``rss-gib`` and ``pss-gib`` of the runs at ``image_size``.

    Sorted by sites; a run without a PSS figure (results of an older
    benchmark) gives NaN, which matplotlib leaves out of the line.
    """
    chosen = sorted((r for r in runs if r["settings"]["image-size"] == image_size), key=lambda r: r["sites"])
    return {"sites": [r["sites"] for r in chosen],
            "round-seconds": [mean(r["round-seconds"]) if r["round-seconds"] else math.nan for r in chosen],
            "rss-gib": [r["peak-rss-gib"] for r in chosen],
            "pss-gib": [r.get("peak-pss-gib", math.nan) for r in chosen]}


def write_scaling_plot(path: Path, runs: Sequence[Mapping[str, object]], image_size: int) -> Path:
    """Draw mean round seconds and peak summed RSS (and PSS) against sites, at ``image_size``, to ``path``."""
    import matplotlib  # here, so that reading results needs no plotting library

    matplotlib.use("Agg")  # no display on a benchmark machine
    import matplotlib.pyplot as plt

    series = sites_series(runs, image_size)
    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    time_axis.plot(series["sites"], series["round-seconds"], marker="o")
    time_axis.set(xlabel="sites", ylabel="mean round (s)", title="Time per round through flwr run")
    memory_axis.plot(series["sites"], series["rss-gib"], marker="o", label="summed RSS")
    memory_axis.plot(series["sites"], series["pss-gib"], marker="s", linestyle="--", label="summed PSS")
    memory_axis.set(xlabel="sites", ylabel="GiB at the peak", title="Peak memory, all processes of a run")
    memory_axis.legend()
    for axis in (time_axis, memory_axis):
        axis.set_xticks(series["sites"])
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    figure.suptitle(f"{image_size} px")
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)
