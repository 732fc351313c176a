"""Averaging of weight dictionaries: FedAvg (McMahan et al. 2017) and FedNova's step-normalized average."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedsm_core.models.weights import Weights, check_same_layout


def weighted_average(weights: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float]) -> Weights:
    """Average weight dictionaries with weights ``n_k / n``.

    ``w = sum_k (n_k / n) * w_k`` with ``n = sum_k n_k``; the sum is done in
    float64 and cast back to each array's dtype. Integer arrays (batch-norm
    counters) are averaged and rounded.

    Parameters
    ----------
    weights : sequence of dict
        One weight dictionary per client, all with the same keys and shapes.
    sizes : sequence of float
        ``n_k``: the number of training examples of each client.

    Returns
    -------
    dict[str, np.ndarray]
        The averaged weights.
    """
    if len(weights) == 0:
        raise ValueError("weighted_average: no weights to average")
    if len(weights) != len(sizes):
        raise ValueError(f"weighted_average: {len(weights)} weight sets but {len(sizes)} sizes")
    total = float(sum(sizes))
    if not np.isfinite(total) or total <= 0 or any(not s >= 0 for s in sizes):
        raise ValueError(f"weighted_average: sizes must be >= 0 with a positive sum, got {list(sizes)}")
    return _affine_combination(weights, [n / total for n in sizes])


def normalized_average(current: Mapping[str, np.ndarray], weights: Sequence[Mapping[str, np.ndarray]],
                       sizes: Sequence[float], steps: Sequence[float]) -> Weights:
    """FedNova's average (Wang et al. 2020): each site's update divided by its local steps.

    ``w <- w - tau_eff * sum_k p_k (w - w_k) / tau_k`` with ``p_k = n_k / n``
    and ``tau_eff = sum_k p_k tau_k``: a site that took more local steps no
    longer pulls the model further by that alone, so the average optimizes the
    sites' weighted objective. With equal ``tau_k`` it is :func:`weighted_average`.

    Parameters
    ----------
    current : dict
        ``w``, the model the sites started from.
    weights, sizes : sequence
        The sites' trained models and ``n_k``, as for :func:`weighted_average`.
    steps : sequence of float
        ``tau_k``: the local steps each site took (>= 1).
    """
    if len(steps) != len(weights) or any(not (np.isfinite(t) and t >= 1) for t in steps):
        raise ValueError(f"normalized_average: one step count >= 1 per site needed, got {list(steps)}")
    total = float(sum(sizes))
    shares = [n / total for n in sizes]
    tau_eff = sum(p * t for p, t in zip(shares, steps, strict=True))
    # Dividing each update by tau_k and scaling by tau_eff is averaging with weights p_k tau_eff / tau_k,
    # plus the remainder of the weight (1 - sum of those) left on the current model.
    scaled = [p * tau_eff / t for p, t in zip(shares, steps, strict=True)]
    check_same_layout(weights[0], current, "the current model")
    return _affine_combination([*weights, current], [*scaled, 1.0 - sum(scaled)])


def _affine_combination(weights: Sequence[Mapping[str, np.ndarray]], coefficients: Sequence[float]) -> Weights:
    """``sum_i c_i w_i`` with coefficients summing to one, some possibly negative.

    The sum is done in float64 and cast back to each array's dtype; integer
    arrays (batch-norm counters) are rounded.
    """
    for index, other in enumerate(weights[1:], start=1):
        check_same_layout(weights[0], other, f"weight set {index}")
    combined: Weights = {}
    for key, first in weights[0].items():
        acc = np.zeros(np.shape(first), dtype=np.float64)
        for w, c in zip(weights, coefficients, strict=True):
            acc += c * np.asarray(w[key], dtype=np.float64)
        dtype = np.asarray(first).dtype
        combined[key] = np.rint(acc).astype(dtype) if np.issubdtype(dtype, np.integer) else acc.astype(dtype)
    return combined
