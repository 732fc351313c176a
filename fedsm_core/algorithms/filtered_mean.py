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

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from fedsm_core.algorithms.aggregation import weighted_average
from fedsm_core.models.weights import Weights, check_same_layout


def median_scores(weights: Sequence[Mapping[str, np.ndarray]], origin: Mapping[str, np.ndarray] | None = None,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``d_k = ||w_k - m||`` and ``cos(w_k - o, m - o)``, ``m`` the coordinate median, in one pass over the arrays.

    Float64, shape ``(K,)`` each; one median per array serves both (a model's
    median is what costs). Integer arrays (batch-norm counters) are
    bookkeeping, not parameters, and are left out as update clipping leaves
    them out of norms. Without ``origin`` the cosines are ``nan``; a zero
    update, or a zero median update, has cosine 1: nothing to point elsewhere.
    """
    if len(weights) == 0:
        raise ValueError("filtered mean: no weights to aggregate")
    for index, other in enumerate(weights[1:], start=1):
        check_same_layout(weights[0], other, f"filtered mean: weight set {index}")
    if origin is not None:
        check_same_layout(origin, weights[0], "filtered mean: the round's start model")
    squares, dots, norms = (np.zeros(len(weights), dtype=np.float64) for _ in range(3))
    median_norm = 0.0
    for key, first in weights[0].items():
        if not np.issubdtype(np.asarray(first).dtype, np.floating):
            continue
        stacked = np.stack([np.asarray(w[key], dtype=np.float64).ravel() for w in weights])
        if origin is not None:  # updates; their distances to the median update are the weights' to the median
            stacked -= np.asarray(origin[key], dtype=np.float64).ravel()
        median = np.median(stacked, axis=0)
        squares += np.square(stacked - median).sum(axis=1)
        dots += stacked @ median
        norms += np.square(stacked).sum(axis=1)
        median_norm += float(np.square(median).sum())
    if origin is None:
        return np.sqrt(squares), np.full(len(weights), np.nan)
    scale = np.sqrt(norms * median_norm)
    return np.sqrt(squares), np.where(scale > 0, dots / np.where(scale > 0, scale, 1.0), 1.0)


def distances_to_median(weights: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
    """``d_k = ||w_k - m||`` over all float arrays (:func:`median_scores`)."""
    return median_scores(weights)[0]


def cosines_to_median(weights: Sequence[Mapping[str, np.ndarray]], origin: Mapping[str, np.ndarray]) -> np.ndarray:
    """``cos(w_k - o, m - o)`` over all float arrays (:func:`median_scores`)."""
    return median_scores(weights, origin)[1]


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


@dataclasses.dataclass(frozen=True)
class FilterDecision:
    """Which replies the filtered mean keeps, and each reply's scores (for the run's log)."""

    keep: np.ndarray
    distances: np.ndarray
    cosines: np.ndarray

    @property
    def left_out(self) -> list[int]:
        """Indices of the replies left out, in reply order."""
        return [int(i) for i in np.flatnonzero(~self.keep)]

    @property
    def scores(self) -> list[tuple[float, float]]:
        """Per reply: its distance over the median distance, and its update's cosine (``nan`` without origin)."""
        typical = float(np.median(self.distances))
        ratios = self.distances / typical if typical > 0 else np.where(self.distances > 0, np.inf, 0.0)
        return [(float(r), float(c)) for r, c in zip(ratios, self.cosines, strict=True)]

    def mean(self, weights: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float]) -> Weights:
        """FedAvg's weighted mean of the kept replies."""
        if len(weights) != len(sizes):
            raise ValueError(f"filtered mean: {len(weights)} weight sets but {len(sizes)} sizes")
        return weighted_average([w for w, k in zip(weights, self.keep, strict=True) if k],
                                [n for n, k in zip(sizes, self.keep, strict=True) if k])


def filter_replies(weights: Sequence[Mapping[str, np.ndarray]], factor: float,
                   origin: Mapping[str, np.ndarray] | None = None, min_cosine: float = -1.0) -> FilterDecision:
    """The distance bound, and with ``origin`` and ``min_cosine > -1`` the direction bound, in one pass."""
    distances, cosines = median_scores(weights, origin)
    directed = origin is not None and min_cosine > -1.0
    return FilterDecision(kept_replies(distances, factor, cosines if directed else None, min_cosine),
                          distances, cosines)


def filter_scores(weights: Sequence[Mapping[str, np.ndarray]], origin: Mapping[str, np.ndarray] | None = None,
                  ) -> list[tuple[float, float]]:
    """Per reply: its distance to the coordinate median over the median distance, and its update's cosine.

    What the two bounds compare with ``filter-factor`` and ``filter-min-cosine``
    (the cosine is ``nan`` without ``origin``).
    """
    return filter_replies(weights, 1.0, origin).scores


def left_out_replies(weights: Sequence[Mapping[str, np.ndarray]], factor: float,
                     origin: Mapping[str, np.ndarray] | None = None, min_cosine: float = -1.0) -> list[int]:
    """Indices of the replies :func:`filtered_mean` leaves out, in reply order (for the run's log and summary)."""
    return filter_replies(weights, factor, origin, min_cosine).left_out


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
    return filter_replies(weights, factor, origin, min_cosine).mean(weights, sizes)
