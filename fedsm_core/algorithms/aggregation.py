"""Weighted averaging of weight dictionaries (FedAvg, McMahan et al. 2017)."""

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
    for index, other in enumerate(weights[1:], start=1):
        check_same_layout(weights[0], other, f"weight set {index}")
    averaged: Weights = {}
    for key, first in weights[0].items():
        acc = np.zeros(np.shape(first), dtype=np.float64)
        for w, n in zip(weights, sizes, strict=True):
            acc += (n / total) * np.asarray(w[key], dtype=np.float64)
        dtype = np.asarray(first).dtype
        averaged[key] = np.rint(acc).astype(dtype) if np.issubdtype(dtype, np.integer) else acc.astype(dtype)
    return averaged
