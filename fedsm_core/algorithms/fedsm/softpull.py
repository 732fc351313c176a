"""SoftPull: the personalized-model update of FedSM (Xu et al., CVPR 2022, Eq. 4)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedsm_core.models.weights import Weights, check_same_layout


def check_lam(lam: float, num_sites: int) -> None:
    """Raise ``ValueError`` unless ``1 / K <= lam <= 1``."""
    if num_sites < 1:
        raise ValueError(f"SoftPull needs at least one site, got {num_sites}")
    if not (1.0 / num_sites - 1e-12 <= lam <= 1.0):
        raise ValueError(
            f"softpull-lambda = {lam} is outside [1/K, 1] = [{1.0 / num_sites:.4f}, 1] for K = {num_sites} "
            "sites; set it in [tool.flwr.app.config] or with --run-config"
        )


def soft_pull(personalized: Mapping[str, Mapping[str, np.ndarray]], lam: float) -> dict[str, Weights]:
    """Pull every personalized model softly toward the others.

    For each site ``k`` of ``K``::

        w_p,k <- lam * w_p,k + (1 - lam) / (K - 1) * sum_{k' != k} w_p,k'

    ``lam = 1/K`` gives every site the plain average of the K models;
    ``lam = 1`` leaves each model untouched (local training). Computed in
    float64 and cast back to each array's dtype; integer arrays (batch-norm
    counters) are kept as they are.

    Parameters
    ----------
    personalized : Mapping[str, Mapping[str, np.ndarray]]
        Site name -> that site's personalized weights (same layout for all).
    lam : float
        The SoftPull coefficient, ``1/K <= lam <= 1``.

    Returns
    -------
    dict[str, dict[str, np.ndarray]]
        Site name -> pulled weights.
    """
    sites = list(personalized)
    check_lam(lam, len(sites))
    if len(sites) == 1:
        return {sites[0]: {k: np.array(v, copy=True) for k, v in personalized[sites[0]].items()}}
    reference = personalized[sites[0]]
    for site in sites[1:]:
        check_same_layout(reference, personalized[site], f"personalized model of {site}")
    others_weight = (1.0 - lam) / (len(sites) - 1)
    pulled: dict[str, Weights] = {site: {} for site in sites}
    for key, first in reference.items():
        dtype = np.asarray(first).dtype
        if np.issubdtype(dtype, np.integer):
            for site in sites:
                pulled[site][key] = np.array(personalized[site][key], copy=True)
            continue
        stacked = np.stack([np.asarray(personalized[s][key], dtype=np.float64) for s in sites])
        total = stacked.sum(axis=0)
        for index, site in enumerate(sites):
            mixed = lam * stacked[index] + others_weight * (total - stacked[index])
            pulled[site][key] = mixed.astype(dtype)
    return pulled
