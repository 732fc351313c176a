r"""Gamma chosen on cross-fitted validation Dice of the finally fine-tuned personalized models.

With ``fine-tune-passes = E > 0`` each site reads its validation split twice:
final fine-tuning keeps the pass best on it
(:mod:`fedsm_core.algorithms.fedsm.final_fine_tuning`), then the super model
is scored on the same images to choose gamma
(:mod:`fedsm_core.algorithms.fedsm.gamma`). The kept model's validation Dice
is the largest of ``E + 1`` noisy values, so it is optimistic, and gamma leans
towards routing images to it. Cross-fitting (``fine-tune-gamma =
"cross-fit"``) takes that optimism out of the gamma choice without holding
images out of either step. Site ``k`` halves its validation split by case
(:func:`halve_by_case`) and scores each of its own images ``x`` with the model
of the pass best on the *other* half:

.. math::

    D_k^{cf}(x) = \mathrm{Dice}\big(w^{(e^*_{\bar h(x)})}; x\big), \qquad
    e^*_h = \arg\max_{0 \le e \le E} \mathrm{Dice}(w^{(e)}; D_{k,h}^{val}),

where ``h(x)`` is the half holding ``x`` and ``\bar h`` the other one. All
passes are one training run (the batch order is seeded), so the halves only
choose different passes of it
(:func:`~fedsm_core.algorithms.fedsm.final_fine_tuning.fine_tune_on_splits`).
The site's gamma sweeps are these per-image Dice routed as the super model
routes (:func:`cross_fitted_metrics`); an image routed to the global model or
to another site's model is scored as before (that model's pass was chosen on
other images). The deployed personalized model stays the pass best on the
whole split: only the gamma choice changes.

On ``synthetic-prostate`` (seed 0) the fine-tuned models scored 0.9506 on the
validation split that chose them, 0.9430 cross-fitted (the global model's
level), and 0.9293 on test against the global model's 0.9398: cross-fitting
sent every image to the global model (``docs/results.md``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from fedsm_core.algorithms.fedsm.super_model import SuperModel
from fedsm_core.data.arrays import SegArrays
from fedsm_core.data.cases import named_case
from fedsm_core.data.repartition import take
from fedsm_core.evaluation.super_model_evaluation import evaluate_super_model

# Sweep metrics that are sums over a site's images (merged by adding); the Dice sweep is a mean
SUMMED = ("routing-gain-sweep", "routed-count-sweep")


def halve_by_case(data: SegArrays) -> tuple[SegArrays, SegArrays]:
    """The even- and the odd-numbered cases of a split (an image without a case is a case of its own).

    Halving by case keeps the slices of one volume together: neighbouring
    slices are nearly alike, so a choice made on the even slices of a case
    and scored on its odd ones would barely be held out. Cases are numbered
    in order of their first image.
    """
    order = list(dict.fromkeys(named_case(example) or example for example in data.ids))
    number = {case: index for index, case in enumerate(order)}
    parity = np.array([number[named_case(example) or example] % 2 for example in data.ids], dtype=np.int64)
    return take(data, np.flatnonzero(parity == 0)), take(data, np.flatnonzero(parity == 1))


def can_cross_fit(data: SegArrays) -> bool:
    """Whether both halves of ``data`` (:func:`halve_by_case`) hold images."""
    return all(len(half) > 0 for half in halve_by_case(data))


def merge_halves(first: Mapping[str, object], second: Mapping[str, object]) -> dict[str, object]:
    """One site's gamma-sweep metrics over two disjoint halves of its images.

    ``dice-super-sweep`` is a mean over the images with foreground, so the
    halves are weighted by those counts (``num-images - num-empty``); image
    counts and the per-model routing sweeps are sums.
    """
    weights = [float(m["num-images"]) - float(m.get("num-empty", 0.0)) for m in (first, second)]
    total = sum(weights)
    sweeps = zip(first["dice-super-sweep"], second["dice-super-sweep"], strict=True)
    merged: dict[str, object] = {
        "dice-super-sweep": [(a * weights[0] + b * weights[1]) / total if total else 0.0 for a, b in sweeps],
        "num-images": float(first["num-images"]) + float(second["num-images"]),
        "num-empty": float(first.get("num-empty", 0.0)) + float(second.get("num-empty", 0.0)),
    }
    for key in SUMMED:
        if key in first and key in second:
            total_sweep = np.asarray(first[key], dtype=np.float64) + np.asarray(second[key], dtype=np.float64)
            merged[key] = total_sweep.tolist()
    return merged


def cross_fitted_metrics(super_model: SuperModel, site_index: int, val: SegArrays,
                         chosen_on_half: Sequence[torch.nn.Module], batch_size: int, device: torch.device | str,
                         gammas: Sequence[float], route_by: str = "image") -> dict[str, object]:
    """The site's gamma sweeps on ``val`` with its own images of each half scored by the other half's model.

    Parameters
    ----------
    super_model : SuperModel
        The super model as deployed (personalized model ``site_index``: the
        pass best on the whole split). Left as it was.
    site_index : int
        The site, also the index of its personalized model.
    val : SegArrays
        The site's validation split; halved by :func:`halve_by_case`.
    chosen_on_half : two modules
        The fine-tuned models of the passes best on half 0 and on half 1.

    Returns
    -------
    dict
        :func:`merge_halves` of the two halves' sweeps.
    """
    deployed = super_model.personalized[site_index]
    parts = []
    try:
        for half, other in zip(halve_by_case(val), reversed(tuple(chosen_on_half)), strict=True):
            super_model.personalized[site_index] = other.to(device)
            parts.append(evaluate_super_model(super_model, site_index, half, batch_size, device, gammas,
                                              route_by=route_by))
    finally:
        super_model.personalized[site_index] = deployed
    return merge_halves(*parts)


def with_cross_fitted_sweeps(metrics: Mapping[str, object], super_model: SuperModel, site_index: int,
                             val: SegArrays, chosen_on_half: Sequence[torch.nn.Module], batch_size: int,
                             device: torch.device | str, gammas: Sequence[float],
                             route_by: str = "image") -> dict[str, object]:
    """A site's validation ``metrics`` with the sweeps that choose gamma cross-fitted (:func:`cross_fitted_metrics`).

    Everything else (``dice-global``, the own model's Dice, selector
    accuracy) stays as measured with the deployed models.
    """
    crossed = cross_fitted_metrics(super_model, site_index, val, chosen_on_half, batch_size, device, gammas, route_by)
    return {**metrics, **{key: crossed[key] for key in ("dice-super-sweep", *SUMMED) if key in metrics}}


def fingerprint(weights: Mapping[str, np.ndarray]) -> str:
    """A digest of a model's weights: which personalized model a site's kept halves belong to."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        array = np.ascontiguousarray(weights[name])
        digest.update(name.encode())
        digest.update(str(array.dtype).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
