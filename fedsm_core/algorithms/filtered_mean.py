"""The filtered mean: FedAvg's weighted mean of the replies that lie near the coordinate median.

The coordinate median and the trimmed mean bound one malicious site's pull, but
they weigh every site alike and take each coordinate from a different site, so
on sites of unequal size and unlike data they cost accuracy without any attack
(``experiments/results/robustness``). The filtered mean keeps FedAvg wherever
no reply stands out, and uses the median only to decide which replies to leave
out. With ``m`` the coordinate median of the ``K`` models and
``d_k = ||w_k - m||`` (all float arrays flattened together)::

    keep k  iff  d_k <= c * median_j d_j
    w = sum_{k kept} n_k w_k / sum_{k kept} n_k

The median of the distances is an honest site's distance while at most half the
sites are malicious, so a reply ``c`` times farther out than a typical one is
left out whatever its claimed size; when every reply is within the bound the
result is FedAvg's mean exactly. Its weights are the example counts, which a
site cannot raise beyond the count it reported at discovery (the server caps
them). What it cannot stop: a malicious reply that stays within ``c`` typical
distances (a slow drift), or a colluding majority, which moves the median.

A well-shaped update that points elsewhere (a site trained on wrong masks)
can lie within the distance bound when honest updates differ in length (sites
that take more local steps move farther). Where the model the round started
from, ``o``, is known (a global model), the direction bound also leaves out a
reply whose update does not point the median's way::

    keep k  iff  also  cos(w_k - o, m - o) >= t      (``filter-min-cosine``; t = -1: off)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedsm_core.algorithms.aggregation import weighted_average
from fedsm_core.models.weights import Weights, check_same_layout


def distances_to_median(weights: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
    """``d_k = ||w_k - m||`` over all float arrays, ``m`` the coordinate median; float64, shape ``(K,)``.

    Integer arrays (batch-norm counters) are bookkeeping, not parameters, and
    are left out of the distance as update clipping leaves them out of norms.
    """
    if len(weights) == 0:
        raise ValueError("filtered mean: no weights to aggregate")
    for index, other in enumerate(weights[1:], start=1):
        check_same_layout(weights[0], other, f"filtered mean: weight set {index}")
    squares = np.zeros(len(weights), dtype=np.float64)
    for key, first in weights[0].items():
        if not np.issubdtype(np.asarray(first).dtype, np.floating):
            continue
        stacked = np.stack([np.asarray(w[key], dtype=np.float64).ravel() for w in weights])
        squares += np.square(stacked - np.median(stacked, axis=0)).sum(axis=1)
    return np.sqrt(squares)


def cosines_to_median(weights: Sequence[Mapping[str, np.ndarray]], origin: Mapping[str, np.ndarray]) -> np.ndarray:
    """``cos(w_k - o, m - o)`` over all float arrays, ``m`` the coordinate median; float64, shape ``(K,)``.

    A zero update, or a zero median update, has cosine 1: nothing to point elsewhere.
    """
    for index, other in enumerate(weights):
        check_same_layout(origin, other, f"filtered mean: weight set {index}")
    dots = np.zeros(len(weights), dtype=np.float64)
    norms = np.zeros(len(weights), dtype=np.float64)
    median_norm = 0.0
    for key, start in origin.items():
        if not np.issubdtype(np.asarray(start).dtype, np.floating):
            continue
        start = np.asarray(start, dtype=np.float64).ravel()
        updates = np.stack([np.asarray(w[key], dtype=np.float64).ravel() for w in weights]) - start
        median = np.median(updates, axis=0)
        dots += updates @ median
        norms += np.square(updates).sum(axis=1)
        median_norm += float(np.square(median).sum())
    scale = np.sqrt(norms * median_norm)
    return np.where(scale > 0, dots / np.where(scale > 0, scale, 1.0), 1.0)


def kept_replies(distances: np.ndarray, factor: float, cosines: np.ndarray | None = None,
                 min_cosine: float = -1.0) -> np.ndarray:
    """Boolean mask of the replies within ``factor`` times the median distance to the coordinate median.

    When the median distance is 0 (more than half the replies identical), only
    the replies at distance 0 are kept. With ``cosines``, a reply must also
    have ``cosines[k] >= min_cosine``.
    """
    if not factor >= 1.0:
        raise ValueError(f"filter-factor = {factor} must be >= 1: below it, typical replies would be left out")
    keep = distances <= factor * float(np.median(distances))
    return keep if cosines is None else keep & (cosines >= min_cosine)


def _kept(weights: Sequence[Mapping[str, np.ndarray]], factor: float, origin: Mapping[str, np.ndarray] | None,
          min_cosine: float) -> np.ndarray:
    cosines = None if origin is None or min_cosine <= -1.0 else cosines_to_median(weights, origin)
    return kept_replies(distances_to_median(weights), factor, cosines, min_cosine)


def filter_scores(weights: Sequence[Mapping[str, np.ndarray]], origin: Mapping[str, np.ndarray] | None = None,
                  ) -> list[tuple[float, float]]:
    """Per reply: its distance to the coordinate median over the median distance, and its update's cosine.

    What the two bounds compare with ``filter-factor`` and ``filter-min-cosine``
    (the cosine is ``nan`` without ``origin``); for the run's log.
    """
    distances = distances_to_median(weights)
    typical = float(np.median(distances))
    ratios = distances / typical if typical > 0 else np.where(distances > 0, np.inf, 0.0)
    cosines = cosines_to_median(weights, origin) if origin is not None else np.full(len(weights), np.nan)
    return [(float(r), float(c)) for r, c in zip(ratios, cosines, strict=True)]


def left_out_replies(weights: Sequence[Mapping[str, np.ndarray]], factor: float,
                     origin: Mapping[str, np.ndarray] | None = None, min_cosine: float = -1.0) -> list[int]:
    """Indices of the replies :func:`filtered_mean` leaves out, in reply order (for the run's log and summary)."""
    return [int(i) for i in np.flatnonzero(~_kept(weights, factor, origin, min_cosine))]


def filtered_mean(weights: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float],
                  factor: float, origin: Mapping[str, np.ndarray] | None = None, min_cosine: float = -1.0) -> Weights:
    """FedAvg's weighted mean over the replies :func:`kept_replies` keeps.

    Parameters
    ----------
    weights : sequence of dict
        One weight dictionary per site, all with the same keys and shapes.
    sizes : sequence of float
        ``n_k``, the sites' example counts (the server has capped them at the
        counts reported at discovery).
    factor : float
        ``c >= 1`` (``filter-factor``): how many median distances a kept
        reply may lie from the coordinate median.
    origin : dict, optional
        ``o``, the model every reply started from; with it and ``min_cosine >
        -1`` the direction bound applies too.
    min_cosine : float
        ``t`` (``filter-min-cosine``): the least cosine between a kept reply's
        update and the median update.

    Returns
    -------
    dict[str, np.ndarray]
        :func:`~fedsm_core.algorithms.aggregation.weighted_average` of the kept
        replies, in each array's dtype; bit for bit FedAvg when all are kept.
    """
    if len(weights) != len(sizes):
        raise ValueError(f"filtered mean: {len(weights)} weight sets but {len(sizes)} sizes")
    keep = _kept(weights, factor, origin, min_cosine)
    return weighted_average([w for w, k in zip(weights, keep, strict=True) if k],
                            [n for n, k in zip(sizes, keep, strict=True) if k])
