"""Evaluation of the FedSM super model on one site's images."""

from __future__ import annotations

import torch

from fedsm_core.algorithms.super_model import GLOBAL_ROUTE, SuperModel
from fedsm_core.data.arrays import SegArrays
from fedsm_core.metrics import DiceAccumulator, dice_per_image
from fedsm_core.training.batches import iterate_batches


@torch.no_grad()
def evaluate_super_model(
    super_model: SuperModel,
    site_index: int | None,
    data: SegArrays,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
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

    Returns
    -------
    dict[str, float]
        ``dice-global``, ``dice-super``, ``share-global`` (fraction of images the
        selector sent to the global model), ``num-images``; for a training site
        also ``dice-personal`` and ``selector-accuracy`` (argmax equals the
        site, regardless of gamma).
    """
    super_model.eval().to(device)
    scores = {name: DiceAccumulator() for name in ("global", "personal", "super")}
    correct = routed_global = 0
    for images, masks in iterate_batches(data, batch_size, shuffle=False):
        images, masks = images.to(device), masks.to(device)
        logits, routes, probs = super_model.forward_with_routes(images)
        scores["super"].add(dice_per_image(logits, masks))
        scores["global"].add(dice_per_image(super_model.global_model(images), masks))
        routed_global += int((routes == GLOBAL_ROUTE).sum())
        if site_index is not None:
            scores["personal"].add(dice_per_image(super_model.personalized[site_index](images), masks))
            correct += int((probs.argmax(dim=1) == site_index).sum())
    count = len(data.images)
    metrics = {
        "dice-global": scores["global"].mean(),
        "dice-super": scores["super"].mean(),
        "share-global": routed_global / count,
        "num-images": float(count),
    }
    if site_index is not None:
        metrics["dice-personal"] = scores["personal"].mean()
        metrics["selector-accuracy"] = correct / count
    return metrics


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
        scores.add(dice_per_image(model(images.to(device)), masks.to(device)))
    return {name: scores.mean(), "num-images": float(len(data.images))}
