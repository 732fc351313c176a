"""FedBN (Li et al., ICLR 2021): normalization layers stay at their site.

Feature shift between scanners shows up in the statistics a normalization
layer learns. FedBN averages every weight but those of the normalization
layers (affine scale and shift, running mean and variance, batch counter),
which each site keeps for itself:

    w_shared <- sum_k (n_k / n) w_k,shared,     w_k,norm stays w_k,norm

The local entries are chosen by module type (batch, instance, group and layer
normalization), never by name substrings: a parameter called ``bn_like`` in
some encoder must not be caught by accident.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch.nn as nn

from fedsm_core.algorithms.robust_aggregation import AggregationSettings, robust_average
from fedsm_core.models.weights import Weights

NORM_TYPES: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def local_entries(model: nn.Module) -> set[str]:
    """State-dict keys (parameters and buffers) of the model's normalization layers."""
    keys: set[str] = set()
    for module_name, module in model.named_modules():
        if isinstance(module, NORM_TYPES):
            prefix = f"{module_name}." if module_name else ""
            keys.update(prefix + name for name, _ in module.named_parameters(recurse=False))
            keys.update(prefix + name for name, _ in module.named_buffers(recurse=False))
    return keys


def fedbn_aggregate(site_weights: Mapping[str, Weights], sizes: Mapping[str, float],
                    local: set[str], aggregation: AggregationSettings | None = None) -> dict[str, Weights]:
    """Each site's next weights: the average of the shared entries, its own local ones.

    The average is n_k-weighted, or the ``aggregation``'s robust statistic.

    Parameters
    ----------
    site_weights : mapping
        Site -> weights after local training.
    sizes : mapping
        Site -> number of training examples ``n_k``.
    local : set of str
        Entries that never leave their site (:func:`local_entries`).
    aggregation : AggregationSettings, optional
        How the shared entries are averaged; the weighted mean when omitted.
    """
    if not site_weights:
        raise ValueError("fedbn_aggregate: no site weights")
    sites = list(site_weights)
    shared = robust_average([shared_part(site_weights[s], local) for s in sites], [sizes[s] for s in sites],
                            aggregation or AggregationSettings())
    return {s: {**shared, **{k: v for k, v in site_weights[s].items() if k in local}} for s in sites}


def shared_part(weights: Weights, local: set[str]) -> Weights:
    """The entries that are averaged (what a FedBN global model holds)."""
    return {k: v for k, v in weights.items() if k not in local}


def merge_local(shared: Weights, own: Weights, local: set[str]) -> Weights:
    """A site's model: the shared entries with its own normalization entries."""
    missing = sorted(set(local) - set(own))
    if missing:
        raise ValueError(f"merge_local: the site's own weights lack normalization entries {missing[:3]}")
    return {**shared, **{k: own[k] for k in local}}
