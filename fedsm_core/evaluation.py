"""Evaluation of the FedSM super model on one site's images."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsm_core.algorithms.super_model import GLOBAL_ROUTE, SuperModel, routed_scores
from fedsm_core.data.arrays import SegArrays
from fedsm_core.device import to_device
from fedsm_core.metrics import DiceAccumulator, dice_per_image
from fedsm_core.training.batches import iterate_batches


@torch.no_grad()
def evaluate_super_model(
    super_model: SuperModel,
    site_index: int | None,
    data: SegArrays,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    gammas: Sequence[float] = (),
) -> dict[str, float | list[float]]:
    """Dice of the global, the site's personalized and the super model, and selector accuracy.

    Parameters
    ----------
    super_model : SuperModel
        Global model, K personalized models, selector and gamma.
    site_index : int or None
        The site the images come from. ``None`` for a site outside the
        federation: personalized Dice and selector accuracy are then omitted.
    data : SegArrays
        The split to evaluate.
    gammas : sequence of float
        Optional sweep: the super model's Dice and the share of images routed
        to the global model at each of these thresholds are returned as the
        lists ``dice-super-sweep`` and ``share-global-sweep`` (same order).

    Returns
    -------
    dict
        ``dice-global``, ``dice-super`` (at the model's gamma), ``share-global``
        (fraction of images the selector sent to the global model), ``num-images``,
        ``gamma`` (the threshold used; not for a selector with a global output);
        for a training site also ``dice-personal`` and ``selector-accuracy``
        (argmax equals the site, regardless of gamma).
    """
    scores = _per_image_scores(super_model.eval().to(device), site_index, data, batch_size, device)
    metrics: dict[str, float | list[float]] = {
        "dice-global": float(scores["global"].mean()),
        "dice-super": float(scores["super"].mean()),
        "share-global": float((scores["super-route"] == GLOBAL_ROUTE).double().mean()),
        "num-images": float(len(data.images)),
    }
    if site_index is not None:
        metrics["dice-personal"] = float(scores["personal"].mean())
        metrics["selector-accuracy"] = float((scores["site"] == site_index).double().mean())
    if not super_model.selector_includes_global:
        metrics["gamma"] = float(super_model.gamma)
    if gammas and not super_model.selector_includes_global:
        metrics["dice-super-sweep"] = [
            float(routed_scores(scores["confidence"], scores["routed"], scores["global"], g).mean()) for g in gammas
        ]
        metrics["share-global-sweep"] = [float((scores["confidence"] <= g).double().mean()) for g in gammas]
    return metrics


def _per_image_scores(
    super_model: SuperModel, site_index: int | None, data: SegArrays, batch_size: int, device: torch.device | str
) -> dict[str, torch.Tensor]:
    """Selector confidence and argmax, and Dice of the global, argmax-routed and own model, per image."""
    keys = ("confidence", "site", "global", "routed", "personal", "super", "super-route")
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for images, masks in iterate_batches(data, batch_size, shuffle=False):
        images, masks = to_device(images, device), to_device(masks, device)
        probs = torch.softmax(super_model.selector(images), dim=1)
        routes = super_model.routes(probs)
        global_dice = dice_per_image(super_model.global_model(images), masks)
        # The most likely site's model, whatever gamma: the candidate of Algorithm 2.
        site = routes if super_model.selector_includes_global else probs.argmax(dim=1)
        routed = global_dice.clone()
        for index in site.unique().tolist():
            chosen = site == index
            if index != GLOBAL_ROUTE:
                routed[chosen] = dice_per_image(super_model.personalized[index](images[chosen]), masks[chosen])
        parts["confidence"].append(probs.max(dim=1).values)
        parts["site"].append(site)
        parts["global"].append(global_dice)
        parts["routed"].append(routed)
        parts["super"].append(torch.where(routes == GLOBAL_ROUTE, global_dice, routed))
        parts["super-route"].append(routes)
        if site_index is not None:
            parts["personal"].append(dice_per_image(super_model.personalized[site_index](images), masks))
    return {key: torch.cat(values).cpu() for key, values in parts.items() if values}


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module,
    data: SegArrays,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    name: str = "dice-global",
) -> dict[str, float]:
    """Mean per-image Dice of one segmentation model on a split.

    Returns
    -------
    dict[str, float]
        ``{name: mean Dice, "num-images": N}``.
    """
    model.eval().to(device)
    scores = DiceAccumulator()
    for images, masks in iterate_batches(data, batch_size, shuffle=False):
        scores.add(dice_per_image(model(to_device(images, device)), to_device(masks, device)))
    return {name: scores.mean(), "num-images": float(len(data.images))}
