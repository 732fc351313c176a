"""Choosing FedSM's selector threshold gamma on validation data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# 0.00, 0.05, ..., 1.00: gamma = 0 always trusts the selector, gamma = 1 always uses the global model.
GAMMA_GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(21))


def pool_sweeps(sweeps: Mapping[str, tuple[Sequence[float], float]], gammas: Sequence[float]) -> list[float]:
    r"""Pool per-site Dice-versus-gamma curves, weighting each site by its image count.

    .. math:: \bar D(\gamma) = \sum_k n_k D_k(\gamma) / \sum_k n_k

    Giving every site the weight 1 instead (``n_k = 1``) yields the client
    average, the mean of the sites' curves.

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


def choose_model_gammas(gains: Sequence[float], counts: Sequence[float], gammas: Sequence[float],
                        fallback: float) -> tuple[float, ...]:
    """One gamma per personalized model from the validation sweeps, pooled over sites.

    Parameters
    ----------
    gains, counts : sequence of float
        ``K * G`` values, model by model (:func:`fedsm_core.evaluation.super_model_evaluation.model_sweeps`,
        summed over the sites): the Dice that routing model ``m``'s images
        above threshold ``g`` gains over the global model, and how many images that is.
    gammas : sequence of float
        The ``G`` thresholds swept.
    fallback : float
        The gamma of a model no validation image was routed to (the pooled
        choice of :func:`choose_gamma`): no evidence for or against it.

    Returns
    -------
    tuple of float
        ``gamma_m`` maximising model ``m``'s gain (ties: the smallest). A model
        that loses to the global model at every threshold gets a gamma at
        which no image reaches it (the top of the grid, 1.0 on the default one).
    """
    size = len(gammas)
    if not size or len(gains) != len(counts) or len(gains) % size:
        raise ValueError(f"choose_model_gammas: {len(gains)} gains and {len(counts)} counts for {size} gammas")
    chosen = []
    for start in range(0, len(gains), size):
        gain, count = gains[start:start + size], counts[start:start + size]
        if not any(count):
            chosen.append(float(fallback))
            continue
        best = max(gain)
        chosen.append(float(min(g for g, value in zip(gammas, gain, strict=True) if value == best)))
    return tuple(chosen)


def describe_gamma(gamma: float | Sequence[float], site_names: Sequence[str]) -> str:
    """``0.30``, or one gamma per site's model: ``site-1 0.00, site-2 1.00, ...``."""
    if isinstance(gamma, (list, tuple)):
        return ", ".join(f"{name} {g:.2f}" for name, g in zip(site_names, gamma, strict=True))
    return f"{gamma:.2f}"


def select_gamma(rule: str, validation: Mapping[str, Mapping[str, object]],
                 default: float) -> float | tuple[float, ...]:
    """The run's gamma from one validation round's per-site metrics, by ``gamma-selection`` rule.

    ``validation`` maps each site to its evaluation metrics with the sweeps
    (:func:`fedsm_core.evaluation.super_model_evaluation.evaluate_super_model`). ``fixed`` keeps
    ``default``; ``validation`` is :func:`choose_gamma` on the pooled sweep,
    each site weighted by its images with foreground; ``client-average`` is
    :func:`choose_gamma` on the mean of the sites' sweeps (every site weighs
    the same, as in the client-average Dice the studies report, so the large
    sites do not choose the small sites' gamma); ``per-model`` is
    :func:`choose_model_gammas` on the gains summed over sites (sites
    without per-model sweeps make it fall back to ``validation``).
    """
    if rule == "fixed" or not validation:
        return default
    sweeps = {site: (m["dice-super-sweep"], 1.0 if rule == "client-average"
                     else float(m.get("num-images", 0.0)) - float(m.get("num-empty", 0.0)))
              for site, m in validation.items()}
    pooled = choose_gamma(pool_sweeps(sweeps, GAMMA_GRID), GAMMA_GRID)
    if rule != "per-model" or not all("routing-gain-sweep" in m for m in validation.values()):
        return pooled
    gains = np.sum([m["routing-gain-sweep"] for m in validation.values()], axis=0).tolist()
    counts = np.sum([m["routed-count-sweep"] for m in validation.values()], axis=0).tolist()
    return choose_model_gammas(gains, counts, GAMMA_GRID, pooled)
