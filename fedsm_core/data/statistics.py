"""Per-channel pixel statistics, computed per site and pooled on the server.

The selector standardizes its input with the federation's pixel mean and
standard deviation; each site shares only these few numbers, never images.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ChannelStatistics:
    """Pixel count, mean and variance of every channel of a set of images."""

    count: int
    mean: tuple[float, ...]
    var: tuple[float, ...]

    @property
    def std(self) -> tuple[float, ...]:
        """Standard deviation per channel."""
        return tuple(float(np.sqrt(v)) for v in self.var)


def channel_statistics(images: np.ndarray) -> ChannelStatistics:
    """Statistics of images ``[N, C, H, W]`` per channel (population variance)."""
    if images.ndim != 4 or images.shape[0] == 0:
        raise ValueError(f"channel_statistics: expected non-empty [N, C, H, W] images, got shape {images.shape}")
    values = np.asarray(images, dtype=np.float64)
    count = values.shape[0] * values.shape[2] * values.shape[3]
    return ChannelStatistics(
        count, tuple(values.mean(axis=(0, 2, 3)).tolist()), tuple(values.var(axis=(0, 2, 3)).tolist())
    )


def pool_channel_statistics(parts: Sequence[ChannelStatistics]) -> ChannelStatistics:
    """Combine per-site statistics into those of the pooled pixels.

    ``mean = sum_k n_k mu_k / n`` and ``var = sum_k n_k (var_k + mu_k^2) / n - mean^2``.
    """
    if not parts:
        raise ValueError("pool_channel_statistics: no statistics to pool")
    if len({len(p.mean) for p in parts} | {len(p.var) for p in parts}) != 1:
        counts = [len(p.mean) for p in parts]
        raise ValueError(f"pool_channel_statistics: sites report different channel counts {counts}")
    counts = np.array([p.count for p in parts], dtype=np.float64)
    means = np.array([p.mean for p in parts], dtype=np.float64)
    variances = np.array([p.var for p in parts], dtype=np.float64)
    total = counts.sum()
    mean = (counts[:, None] * means).sum(axis=0) / total
    second = (counts[:, None] * (variances + means**2)).sum(axis=0) / total
    return ChannelStatistics(int(total), tuple(mean.tolist()), tuple(np.maximum(second - mean**2, 0.0).tolist()))
