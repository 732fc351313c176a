"""Robust aggregation of weight dictionaries: trimmed mean, coordinate median and Krum, and robust SoftPull.

A compromised site can send any finite, well-shaped update and claim any
example count. The plain weighted mean lets that one update move the shared
model arbitrarily far; the statistics here bound its pull. The trimmed mean and
the median (Yin et al., ICML 2018) are taken per coordinate; Krum (Blanchard
et al., NeurIPS 2017) picks one whole update. They follow Flower's
``FedTrimmedAvg``, ``FedMedian`` and ``Krum`` (``flwr.serverapp.strategy``),
which the tests check against, and are written once on weight dictionaries
(numpy, float64) so every shared model and SoftPull's pull term can use them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from fedsm_core.algorithms.aggregation import weighted_average
from fedsm_core.algorithms.fedsm.softpull import check_lam, soft_pull
from fedsm_core.algorithms.filtered_mean import filtered_mean
from fedsm_core.checks import check_settings, setting
from fedsm_core.models.weights import Weights, check_same_layout

AGGREGATIONS = ("mean", "trimmed-mean", "median", "krum", "filtered-mean")


@dataclasses.dataclass(frozen=True)
class AggregationSettings:
    """The ``aggregation`` run-config keys.

    Attributes
    ----------
    name : str
        ``filtered-mean`` (the default), ``mean`` (FedAvg's weighted mean),
        ``trimmed-mean``, ``median`` or ``krum`` (``aggregation``). The
        filtered mean is FedAvg's mean whenever no reply stands out; with its
        memory it was the best robust setting of the robustness study, at no
        measurable cost without attack (``experiments/results/robustness``).
    trim_fraction : float
        ``beta``: the fraction of the sites cut at EACH end of every coordinate
        by ``trimmed-mean`` (``trim-fraction``); ``floor(beta K)`` values go per end.
    krum_byzantine : int
        ``f``: how many malicious sites ``krum`` tolerates (``krum-byzantine``);
        Krum needs ``K >= 2f + 3`` sites.
    filter_factor : float
        ``c`` of :mod:`~fedsm_core.algorithms.filtered_mean`: ``filtered-mean``
        leaves out replies farther than ``c`` median distances from the
        coordinate median (``filter-factor``).
    filter_min_cosine : float
        ``t`` of :mod:`~fedsm_core.algorithms.filtered_mean`: where the round's
        start model is known (global models), ``filtered-mean`` also leaves out
        replies whose update has a cosine below ``t`` with the median update;
        -1 turns it off (``filter-min-cosine``).
    filter_memory : bool
        Where the replies' sites are known (global models), ``filtered-mean``
        also leaves out a site whose mean distance ratio over the rounds so far
        exceeds ``filter_factor`` (:mod:`~fedsm_core.algorithms.filter_memory`;
        ``filter-memory``). On by default: against label-flip it measured best
        of the filtered means, at no cost without attack
        (``experiments/results/robustness``).
    clip_update_norm : float
        ``c`` of :func:`~fedsm_core.algorithms.update_clipping.clip_updates`:
        each site's update is cut to at most ``c`` times the median update norm
        before a global model is averaged; 0 turns it off (``clip-update-norm``).
    """

    name: str = setting("filtered-mean", "aggregation", choices=AGGREGATIONS)
    trim_fraction: float = setting(0.2, "trim-fraction", low=0.0, high=0.49)
    krum_byzantine: int = setting(1, "krum-byzantine", low=0, high=1000)
    filter_factor: float = setting(3.0, "filter-factor", low=1.0, high=1e6)
    filter_min_cosine: float = setting(-1.0, "filter-min-cosine", low=-1.0, high=1.0)
    filter_memory: bool = setting(True, "filter-memory")
    clip_update_norm: float = setting(0.0, "clip-update-norm", low=0.0, high=1e6)

    def __post_init__(self) -> None:
        check_settings(self)


def trimmed_mean(weights: Sequence[Mapping[str, np.ndarray]], trim_fraction: float) -> Weights:
    """The coordinate-wise trimmed mean (Yin et al. 2018), as Flower's ``FedTrimmedAvg``.

    Per coordinate, the ``K`` values are sorted, ``c = floor(beta K)`` are cut
    from each end and the rest averaged without weights::

        w = 1 / (K - 2c) * sum_{i = c}^{K - c - 1} w_(i),   w_(0) <= ... <= w_(K-1)

    ``c`` is rounded down from ``beta K`` in floating point, as Flower's
    ``int(cut_fraction * nobs)``, so both cut the same count for every ``K``.

    Parameters
    ----------
    weights : sequence of dict
        One weight dictionary per site, all with the same keys and shapes.
    trim_fraction : float
        ``beta`` in ``[0, 0.5)``; ``0`` gives the plain unweighted mean.

    Returns
    -------
    dict[str, np.ndarray]
        The trimmed mean, in each array's dtype (integer arrays rounded).
    """
    if not 0.0 <= trim_fraction < 0.5:
        raise ValueError(f"trim-fraction = {trim_fraction} is outside [0, 0.5): half the sites or more would be cut")
    return _per_coordinate(weights, lambda stacked: _trimmed_mean_of_stack(stacked, trim_fraction))


def coordinate_median(weights: Sequence[Mapping[str, np.ndarray]]) -> Weights:
    """The coordinate-wise median (Yin et al. 2018), as Flower's ``FedMedian``.

    ``w[j] = median_k w_k[j]``: the middle value for odd ``K``, the mean of the
    two middle values for even ``K`` (``np.median``). Unweighted.

    Parameters
    ----------
    weights : sequence of dict
        One weight dictionary per site, all with the same keys and shapes.

    Returns
    -------
    dict[str, np.ndarray]
        The median, in each array's dtype (integer arrays rounded).
    """
    return _per_coordinate(weights, lambda stacked: np.median(stacked, axis=0))


def krum(weights: Sequence[Mapping[str, np.ndarray]], byzantine: int,
         sizes: Sequence[float] | None = None) -> tuple[Weights, int]:
    """Krum (Blanchard et al. 2017, Sec. 4), as Flower's ``Krum``: the update closest to its neighbours.

    With ``d_ij = ||w_i - w_j||^2`` over all keys flattened together, the score of
    update ``i`` is ``s(i) = sum_{j in N_i} d_ij``, where ``N_i`` are the
    ``K - f - 2`` updates nearest to ``i`` (``i`` itself excluded). The update
    of lowest score wins; on a tie the lowest index, as Flower's ``argsort``.

    Parameters
    ----------
    weights : sequence of dict
        One weight dictionary per site, all with the same keys and shapes.
    byzantine : int
        ``f``, the number of malicious sites tolerated; needs ``K >= 2f + 3``.
    sizes : sequence of float, optional
        The sites' example counts, checked for length only: Krum keeps one
        update, and Flower's weighted mean of that single update is the update.

    Returns
    -------
    tuple[dict[str, np.ndarray], int]
        A copy of the chosen update (dtypes kept) and its index in ``weights``.
    """
    _check_layouts(weights, "krum")
    if sizes is not None and len(sizes) != len(weights):
        raise ValueError(f"krum: {len(weights)} weight sets but {len(sizes)} sizes")
    index = _krum_choice(_squared_distances(weights), byzantine)
    return {key: np.array(value, copy=True) for key, value in weights[index].items()}, index


def robust_average(weights: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float],
                   settings: AggregationSettings) -> Weights:
    """The sites' models combined by ``settings.name``: the one aggregation every strategy calls.

    ``mean`` is :func:`~fedsm_core.algorithms.aggregation.weighted_average`
    (``w = sum_k (n_k / n) w_k``) bit for bit, and ``filtered-mean`` is that
    mean over the replies near the coordinate median. ``trimmed-mean``,
    ``median`` and ``krum`` ignore ``sizes`` (only their count is checked): a
    site's claimed ``n_k`` is what an attacker controls (up to the cap at its
    discovery count), and weighting by it would let one large site outvote the
    others however robust the statistic.

    Parameters
    ----------
    weights : sequence of dict
        One weight dictionary per site, all with the same keys and shapes.
    sizes : sequence of float
        ``n_k``, the sites' example counts (used by ``mean`` only).
    settings : AggregationSettings
        Which statistic and its parameters.

    Returns
    -------
    dict[str, np.ndarray]
        The aggregate, in each array's dtype (integer arrays rounded).
    """
    if settings.name == "mean":
        return weighted_average(weights, sizes)
    if settings.name == "filtered-mean":
        return filtered_mean(weights, sizes, settings.filter_factor)  # the direction bound: ServerOptimizer
    if len(weights) != len(sizes):
        raise ValueError(f"robust_average: {len(weights)} weight sets but {len(sizes)} sizes")
    return _ROBUST_STATISTICS[settings.name](weights, settings)


def robust_soft_pull(personalized: Mapping[str, Mapping[str, np.ndarray]], lam: float,
                     settings: AggregationSettings) -> dict[str, Weights]:
    """Robust SoftPull: each personalized model pulled toward a robust statistic of the others.

    For each site ``k`` of ``K`` (Xu et al. 2022, Eq. 4, with the mean made robust)::

        w_p,k <- lam * w_p,k + (1 - lam) * R_{k' != k} w_p,k'

    where ``R`` is the unweighted ``mean`` (exactly
    :func:`~fedsm_core.algorithms.fedsm.softpull.soft_pull`, which is called),
    the ``trimmed-mean`` or ``median`` of the ``K - 1`` other models per
    coordinate, the other model ``krum`` picks among the ``K - 1`` (which
    needs ``K - 1 >= 2f + 3``), or the unweighted ``filtered-mean`` of the
    ``K - 1``. Computed in float64 and cast back; integer
    arrays (batch-norm counters) are kept as they are, as ``soft_pull`` does.

    Parameters
    ----------
    personalized : Mapping[str, Mapping[str, np.ndarray]]
        Site name -> that site's personalized weights (same layout for all).
    lam : float
        The SoftPull coefficient, ``1/K <= lam <= 1``.
    settings : AggregationSettings
        Which statistic ``R`` and its parameters.

    Returns
    -------
    dict[str, dict[str, np.ndarray]]
        Site name -> pulled weights.
    """
    if settings.name == "mean":
        return soft_pull(personalized, lam)
    sites = list(personalized)
    check_lam(lam, len(sites))
    models = [personalized[site] for site in sites]
    if len(sites) == 1:
        return {sites[0]: {key: np.array(value, copy=True) for key, value in models[0].items()}}
    _check_layouts(models, "robust SoftPull")
    if settings.name == "krum":
        pulls = _krum_of_others(models, settings.krum_byzantine)
    elif settings.name == "filtered-mean":
        pulls = [filtered_mean(models[:k] + models[k + 1:], [1.0] * (len(models) - 1), settings.filter_factor)
                 for k in range(len(models))]
    else:
        pulls = _coordinate_statistic_of_others(models, settings)
    pulled: dict[str, Weights] = {}
    for site, own, pull in zip(sites, models, pulls, strict=True):
        pulled[site] = {key: _mix(own[key], pull[key], lam) for key in own}
    return pulled


def _mix(own: np.ndarray, pull: np.ndarray, lam: float) -> np.ndarray:
    """``lam * own + (1 - lam) * pull`` in float64, in ``own``'s dtype; integer arrays stay ``own``."""
    dtype = np.asarray(own).dtype
    if np.issubdtype(dtype, np.integer):
        # Counters are a site's own bookkeeping, not parameters: soft_pull keeps them too.
        return np.array(own, copy=True)
    mixed = lam * np.asarray(own, dtype=np.float64) + (1.0 - lam) * np.asarray(pull, dtype=np.float64)
    return mixed.astype(dtype)


def _coordinate_statistic_of_others(models: Sequence[Mapping[str, np.ndarray]],
                                    settings: AggregationSettings) -> list[dict[str, np.ndarray]]:
    """Per site ``k``, the trimmed mean or median of the other ``K - 1`` models (float64 arrays)."""
    reduce = _COORDINATE_STATISTICS[settings.name]
    pulls: list[dict[str, np.ndarray]] = [{} for _ in models]
    for key in models[0]:
        # One stack per key, reused for every k, rather than K stacks of K - 1 models.
        stacked = np.stack([np.asarray(model[key], dtype=np.float64) for model in models])
        for k, pull in enumerate(pulls):
            pull[key] = reduce(np.delete(stacked, k, axis=0), settings)
    return pulls


def _krum_of_others(models: Sequence[Mapping[str, np.ndarray]], byzantine: int) -> list[Mapping[str, np.ndarray]]:
    """Per site ``k``, the model Krum picks among the other ``K - 1`` (distances computed once)."""
    others = len(models) - 1
    if others < 2 * byzantine + 3:
        raise ValueError(
            f"krum-byzantine = {byzantine}: robust SoftPull takes Krum over the K - 1 = {others} other sites, "
            f"which needs K - 1 >= 2f + 3 = {2 * byzantine + 3}; lower krum-byzantine or choose another aggregation"
        )
    distances = _squared_distances(models)
    pulls: list[Mapping[str, np.ndarray]] = []
    for k in range(len(models)):
        rest = [j for j in range(len(models)) if j != k]
        pulls.append(models[rest[_krum_choice(distances[np.ix_(rest, rest)], byzantine)]])
    return pulls


def _squared_distances(weights: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
    """``D[i, j] = ||w_i - w_j||^2`` over all keys, in float64, shape ``(K, K)``.

    Summed key by key from differences, so no flattened copy of every model is
    held at once and no ``||x||^2 + ||y||^2 - 2 x.y`` cancellation occurs.
    """
    count = len(weights)
    distances = np.zeros((count, count), dtype=np.float64)
    for key in weights[0]:
        stacked = np.stack([np.asarray(w[key], dtype=np.float64).ravel() for w in weights])
        for i in range(count):
            distances[i] += np.square(stacked - stacked[i]).sum(axis=1)
    return distances


def _krum_choice(distances: np.ndarray, byzantine: int) -> int:
    """The index of lowest Krum score ``sum of the K - f - 2 smallest d_ij, j != i`` (ties: lowest index)."""
    count = distances.shape[0]
    if isinstance(byzantine, bool) or not isinstance(byzantine, (int, np.integer)) or byzantine < 0:
        raise ValueError(f"krum-byzantine = {byzantine!r} must be an integer >= 0")
    if count < 2 * byzantine + 3:
        raise ValueError(
            f"krum-byzantine = {byzantine}: Krum needs K >= 2f + 3 = {2 * byzantine + 3} updates, got K = {count}; "
            "lower krum-byzantine or choose another aggregation"
        )
    neighbours = count - byzantine - 2
    scores = [np.sort(np.delete(row, i))[:neighbours].sum() for i, row in enumerate(distances)]
    return int(np.argmin(scores))  # argmin returns the first minimum: the lowest index wins a tie


def _trimmed_mean_of_stack(stacked: np.ndarray, trim_fraction: float) -> np.ndarray:
    """The trimmed mean along axis 0 of a float64 stack, cutting ``int(beta K)`` values per end."""
    count = stacked.shape[0]
    cut = int(trim_fraction * count)  # Flower's rounding of the cut count, for the same cut at every K
    return np.sort(stacked, axis=0)[cut:count - cut].mean(axis=0)


def _per_coordinate(weights: Sequence[Mapping[str, np.ndarray]],
                    reduce: Callable[[np.ndarray], np.ndarray]) -> Weights:
    """Apply ``reduce`` to each key's float64 stack of shape ``(K, ...)``; cast back, rounding integers."""
    _check_layouts(weights, "robust aggregation")
    combined: Weights = {}
    for key, first in weights[0].items():
        result = reduce(np.stack([np.asarray(w[key], dtype=np.float64) for w in weights]))
        dtype = np.asarray(first).dtype
        combined[key] = np.rint(result).astype(dtype) if np.issubdtype(dtype, np.integer) else result.astype(dtype)
    return combined


def _check_layouts(weights: Sequence[Mapping[str, np.ndarray]], where: str) -> None:
    """``ValueError`` unless there is at least one weight set and all share the first one's keys and shapes."""
    if len(weights) == 0:
        raise ValueError(f"{where}: no weights to aggregate")
    for index, other in enumerate(weights[1:], start=1):
        check_same_layout(weights[0], other, f"{where}: weight set {index}")


# The statistics per name, so robust_average and robust SoftPull dispatch from one table, not string comparisons.
_COORDINATE_STATISTICS: dict[str, Callable[[np.ndarray, AggregationSettings], np.ndarray]] = {
    "trimmed-mean": lambda stacked, settings: _trimmed_mean_of_stack(stacked, settings.trim_fraction),
    "median": lambda stacked, settings: np.median(stacked, axis=0),
}
_ROBUST_STATISTICS: dict[str, Callable[[Sequence[Mapping[str, np.ndarray]], AggregationSettings], Weights]] = {
    "trimmed-mean": lambda weights, settings: trimmed_mean(weights, settings.trim_fraction),
    "median": lambda weights, settings: coordinate_median(weights),
    "krum": lambda weights, settings: krum(weights, settings.krum_byzantine)[0],
}
