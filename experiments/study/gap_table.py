"""Each method against centralized training on the same test images: the gap, with a paired interval.

The study's targets are differences (FedSM at least centralized training's client
average minus half a point, on the mean of the seeds). Within one seed every method
segments the same test images (the data seed fixes the split), so the difference
is paired. Per seed ``s``, with ``d_i = Dice_method(i) - Dice_centralized(i)`` on
the test images ``i`` (with foreground) of site ``k``,

    gap_s = (1 / K) * sum_k mean_{i in site k} d_i

the difference of the two client averages, and the table's gap is the mean of
``gap_s`` over the seeds. Its 95 % interval is a paired bootstrap: every draw
resamples each (seed, site) set of test units with replacement, the same units
for both methods, so what the images share (an image that is hard for every
model) cancels. A unit is an image, or a whole case where the ids name cases
(``"<site>/<case>/<slice>"``): the slices of one volume are not independent
draws, and resampling them one by one would make the interval too narrow.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from fedsm_core.data.cases import named_case

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
                       reference: str = REFERENCE) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Seed -> site -> (per-image Dice difference, unit of each image), on the seeds both methods have.

    Units are integers: images of one case share theirs. Raises ``ValueError``
    when the two runs of a seed scored different test images at a site (they
    cannot then be paired; dropping the unmatched ones would change the test set).
    """
    ours, theirs = _dice_by_image(rows, method), _dice_by_image(rows, reference)
    paired: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for seed in sorted(set(ours) & set(theirs), key=int):
        paired[seed] = {}
        for site in sorted(set(ours[seed]) | set(theirs[seed])):
            mine, base = ours[seed].get(site, {}), theirs[seed].get(site, {})
            if mine.keys() != base.keys():
                raise ValueError(
                    f"seed {seed}, {site}: {method} scored {len(mine)} test images and {reference} {len(base)}, "
                    f"{len(mine.keys() ^ base.keys())} of them not both; the runs of one seed must share a test "
                    "split (same data seed and dataset files): rerun the odd one")
            ids = sorted(mine)
            units = [named_case(image) or image for image in ids]
            _, unit_index = np.unique(units, return_inverse=True)
            paired[seed][site] = (np.array([mine[i] - base[i] for i in ids]), unit_index)
    return paired


def paired_gap_interval(paired: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]], draws: int,
                        rng: np.random.Generator) -> tuple[float, float]:
    """95 % percentile interval of the mean over seeds of the client-average difference.

    Each draw resamples the units of every (seed, site) with replacement; a
    site's difference in a draw is the mean over the images of the drawn units
    (a unit drawn twice counts its images twice).
    """
    total = np.zeros(draws)
    for sites in paired.values():
        client = np.zeros(draws)
        for difference, unit in sites.values():
            sums = np.bincount(unit, weights=difference)
            counts = np.bincount(unit).astype(float)
            drawn = rng.integers(0, len(sums), size=(draws, len(sums)))
            client += sums[drawn].sum(axis=1) / counts[drawn].sum(axis=1) / len(sites)
        total += client / len(paired)
    return float(np.percentile(total, LOW)), float(np.percentile(total, HIGH))


def seed_gaps(paired: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]]) -> dict[str, float]:
    """Seed -> ``gap_s``: the method's client-average Dice minus the reference's."""
    return {seed: float(np.mean([difference.mean() for difference, _ in sites.values()]))
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
             "(95 % paired bootstrap over the test images, over whole cases where the images are slices of cases; "
             f"{draws} draws):", "",
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
