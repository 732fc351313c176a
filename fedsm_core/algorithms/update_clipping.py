"""Update-norm clipping: no site's update may be much longer than a typical site's.

Before averaging, each site's update ``Delta_k = w_k - w`` (all float arrays
together) is scaled down to at most ``c`` times the median of the sites'
update norms:

    Delta_k <- Delta_k * min(1, c * median_j ||Delta_j|| / ||Delta_k||)

A malicious site that scales its update up (``sign-flip`` with a large scale,
``noise``) is cut to a typical length, which bounds how far it can move the
mean by its length alone; the direction stays its own, so clipping complements
a robust statistic rather than replacing it. With at most half the sites
malicious, the median is an honest site's norm. ``clip-update-norm = 0`` turns
it off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedsm_core.models.weights import Weights, check_same_layout


def update_norms(current: Mapping[str, np.ndarray], weights: Sequence[Mapping[str, np.ndarray]]) -> list[float]:
    """``||w_k - w||`` of each site over all its float arrays (float64)."""
    norms = []
    for index, site in enumerate(weights):
        check_same_layout(current, site, f"update of site {index}")
        squares = sum(float(np.sum((np.asarray(site[key], np.float64) - np.asarray(current[key], np.float64)) ** 2))
                      for key in current if np.issubdtype(np.asarray(current[key]).dtype, np.floating))
        norms.append(float(np.sqrt(squares)))
    return norms


def clip_updates(current: Mapping[str, np.ndarray], weights: Sequence[Mapping[str, np.ndarray]],
                 factor: float) -> list[Weights]:
    """Each site's model with its update scaled to at most ``factor`` times the median update norm.

    Integer arrays (counters) and updates within the bound are returned as they
    are (copies); float arrays keep their dtype.
    """
    if factor <= 0:
        raise ValueError(f"clip-update-norm = {factor}: the factor must be > 0 (0 turns clipping off upstream)")
    norms = update_norms(current, weights)
    bound = factor * float(np.median(norms))
    clipped = []
    for site, norm in zip(weights, norms, strict=True):
        scale = 1.0 if norm <= bound or norm == 0.0 else bound / norm
        clipped.append({key: _scaled(current[key], value, scale) for key, value in site.items()})
    return clipped


def _scaled(current: np.ndarray, value: np.ndarray, scale: float) -> np.ndarray:
    dtype = np.asarray(value).dtype
    if scale == 1.0 or not np.issubdtype(dtype, np.floating):
        return np.array(value, copy=True)
    start = np.asarray(current, np.float64)
    return (start + scale * (np.asarray(value, np.float64) - start)).astype(dtype)
