"""Choosing FedSM's selector threshold gamma on validation data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# 0.00, 0.05, ..., 1.00: gamma = 0 always trusts the selector, gamma = 1 always uses the global model.
GAMMA_GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(21))


def pool_sweeps(sweeps: Mapping[str, tuple[Sequence[float], float]], gammas: Sequence[float]) -> list[float]:
    """Pool per-site Dice-versus-gamma curves, weighting each site by its image count.

    Parameters
    ----------
    sweeps : Mapping[str, (sequence of float, float)]
        Site -> (super-model Dice at each gamma, number of images).
    gammas : sequence of float
        The thresholds the curves were measured at.
    """
    if not sweeps:
        raise ValueError("pool_sweeps: no site reported a gamma sweep")
    total = np.zeros(len(gammas))
    images = 0.0
    for site, (curve, count) in sweeps.items():
        if len(curve) != len(gammas):
            raise ValueError(f"{site} reported {len(curve)} sweep values for {len(gammas)} gammas")
        total += count * np.asarray(curve, dtype=np.float64)
        images += count
    return (total / images).tolist()


def choose_gamma(pooled: Sequence[float], gammas: Sequence[float]) -> float:
    """The gamma with the highest pooled validation Dice; ties go to the smallest gamma.

    The smallest tied gamma trusts the selector most among equally good choices.
    """
    if len(pooled) != len(gammas) or not gammas:
        raise ValueError(f"choose_gamma: {len(pooled)} values for {len(gammas)} gammas")
    best = max(pooled)
    return float(min(g for g, value in zip(gammas, pooled, strict=True) if value == best))
