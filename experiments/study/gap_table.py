"""Each method against centralized training on the same test images: the gap, with a paired interval.

The study's targets are differences (FedSM at least centralized training's client
average minus half a point, on the mean of the seeds). Within one seed every method
segments the same test images (the data seed fixes the split), so the difference
is paired. Per seed ``s``, with ``d_i = Dice_method(i) - Dice_centralized(i)`` on
the test images ``i`` (with foreground) of site ``k``,

    gap_s = (1 / K) * sum_k mean_{i in site k} d_i

the difference of the two client averages, and the table's gap is the mean of
``gap_s`` over the seeds. Its 95 % interval is a paired bootstrap: every draw
resamples each (seed, site) set of test images with replacement, the same images
for both methods, so what the images share (an image that is hard for every
model) cancels.

The unit is the image, also where images are slices of cases. Slices of one
volume are not independent draws, but the generated test sets hold two to five
cases per site, too few for a bootstrap over cases: its variance is ``(n - 1) / n``
of the cases' spread (half of it with two cases), and on ``synthetic-prostate``
it gave an interval of FedAvg's gap about two thirds as wide as the one over
slices. The table keeps the wider one; on such test sets either interval is a
guide, not a test.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

REFERENCE = "centralized"
MARGIN = 0.005  # the study's target: within half a point of centralized training
LOW, HIGH = 2.5, 97.5


def _dice_by_image(rows: Sequence[Mapping[str, str]], method: str) -> dict[str, dict[str, dict[str, float]]]:
    """Seed -> site -> image id -> Dice, from ``method``'s per-image rows."""
    found: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        if row["method"] == method and row["kind"] == "image":
            found[row["seed"]][row["site"]][row["image"]] = float(row["value"])
    return found


def paired_differences(rows: Sequence[Mapping[str, str]], method: str,
                       reference: str = REFERENCE) -> dict[str, dict[str, np.ndarray]]:
    """Seed -> site -> per-image Dice difference (method minus reference), on the seeds both methods have.

    Raises ``ValueError`` when the two runs of a seed scored different test
    images at a site (they cannot then be paired; dropping the unmatched ones
    would change the test set).
    """
    ours, theirs = _dice_by_image(rows, method), _dice_by_image(rows, reference)
    paired: dict[str, dict[str, np.ndarray]] = {}
    for seed in sorted(set(ours) & set(theirs), key=int):
        paired[seed] = {}
        for site in sorted(set(ours[seed]) | set(theirs[seed])):
            mine, base = ours[seed].get(site, {}), theirs[seed].get(site, {})
            if mine.keys() != base.keys():
                raise ValueError(
                    f"seed {seed}, {site}: {method} scored {len(mine)} test images and {reference} {len(base)}, "
                    f"{len(mine.keys() ^ base.keys())} of them not both; the runs of one seed must share a test "
                    "split (same data seed and dataset files): rerun the odd one")
            paired[seed][site] = np.array([mine[image] - base[image] for image in sorted(mine)])
    return paired


def paired_gap_interval(paired: Mapping[str, Mapping[str, np.ndarray]], draws: int,
                        rng: np.random.Generator) -> tuple[float, float]:
    """95 % percentile interval of the mean over seeds of the client-average difference.

    Each draw resamples the images of every (seed, site) with replacement; their
    differences are paired, so one draw takes the same images for both methods.
    """
    total = np.zeros(draws)
    for sites in paired.values():
        client = np.zeros(draws)
        for difference in sites.values():
            drawn = rng.integers(0, len(difference), size=(draws, len(difference)))
            client += difference[drawn].mean(axis=1) / len(sites)
        total += client / len(paired)
    return float(np.percentile(total, LOW)), float(np.percentile(total, HIGH))


def seed_gaps(paired: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Seed -> ``gap_s``: the method's client-average Dice minus the reference's."""
    return {seed: float(np.mean([difference.mean() for difference in sites.values()]))
            for seed, sites in paired.items()}


def _points(value: float) -> str:
    return f"{100 * value:+.2f}"


def gap_table(rows: Sequence[Mapping[str, str]], dataset: str, display: Mapping[str, str],
              draws: int, margin: float = MARGIN) -> list[str]:
    """Markdown lines: every method's client-average gap to centralized training, per seed and on the mean.

    Empty when the dataset has no per-image rows of centralized training. The
    last two columns read the target: the mean gap at least ``-margin``, and
    the whole interval above it (the gap is then not noise of the test images).
    """
    mine = [r for r in rows if r["dataset"] == dataset]
    methods = [m for m in dict.fromkeys(r["method"] for r in mine if r["kind"] == "image") if m != REFERENCE]
    if not methods or not any(r["method"] == REFERENCE and r["kind"] == "image" for r in mine):
        return []
    bound = _points(-margin)
    lines = [f"Client-average test Dice minus centralized training's, in points, on the same test images "
             f"(95 % paired bootstrap over the test images, {draws} draws):", "",
             f"| method | per seed | mean | 95 % paired CI | mean >= {bound} | CI above {bound} |",
             "|---|---|---|---|---|---|"]
    for method in methods:
        paired = paired_differences(mine, method)
        if not paired:
            continue
        gaps = seed_gaps(paired)
        mean = float(np.mean(list(gaps.values())))
        rng = np.random.default_rng(zlib.crc32(f"gap/{dataset}/{method}".encode()))
        low, high = paired_gap_interval(paired, draws, rng)
        cells = [" / ".join(_points(gaps[s]) for s in gaps), _points(mean),
                 f"[{_points(low)}, {_points(high)}]", "yes" if mean >= -margin else "no",
                 "yes" if low > -margin else "no"]
        lines.append(f"| {display.get(method, method)} | " + " | ".join(cells) + " |")
    return lines
