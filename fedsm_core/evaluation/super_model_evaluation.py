"""Evaluation of the FedSM super model on one site's images."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsm_core.algorithms.fedsm.super_model import GLOBAL_ROUTE, SuperModel, is_confident, routed_scores
from fedsm_core.data.arrays import SegArrays
from fedsm_core.device import to_device
from fedsm_core.metrics import ImageScores, dice_per_image, has_foreground, predicts_foreground, split_scores
from fedsm_core.training.batches import iterate_batches


@torch.no_grad()
def evaluate_super_model(
    super_model: SuperModel,
    site_index: int | None,
    data: SegArrays,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    gammas: Sequence[float] = (),
    routing: bool = False,
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
        lists ``dice-super-sweep`` and ``share-global-sweep`` (same order), and
        per personalized model ``routing-gain-sweep`` and ``routed-count-sweep``
        (:func:`model_sweeps`).
    routing : bool
        Also return this site's row of the routing matrix (:func:`routing_cells`).

    Returns
    -------
    dict
        ``dice-global``, ``dice-super`` (at the model's gamma), ``share-global``
        (fraction of images the selector sent to the global model), ``num-images``,
        ``gamma`` (the threshold of this site's own model; not for a selector
        with a global output);
        for a training site also ``dice-personal`` and ``selector-accuracy``
        (argmax equals the site, regardless of gamma). Dice means run over
        images with foreground; ``num-empty`` counts the others and
        ``empty-fp-<model>`` is the share of them where the model predicted
        foreground (:mod:`fedsm_core.metrics`); so do the Dice sweeps.
    """
    scores = _per_image_scores(super_model.eval().to(device), site_index, data, batch_size, device)
    metrics: dict[str, float | list[float]] = {
        **split_scores(scores["global"], scores["global-any"], scores["foreground"], "dice-global"),
        **split_scores(scores["super"], scores["super-any"], scores["foreground"], "dice-super"),
        "share-global": float((scores["super-route"] == GLOBAL_ROUTE).double().mean()),
        "num-images": float(len(data.images)),
    }
    if site_index is not None:
        metrics.update(split_scores(scores["personal"], scores["personal-any"], scores["foreground"], "dice-personal"))
        metrics["selector-accuracy"] = float((scores["site"] == site_index).double().mean())
    if not super_model.selector_includes_global and (site_index is not None or isinstance(super_model.gamma, float)):
        # the threshold this site's images meet when routed to their own site's model
        gamma = super_model.gamma
        metrics["gamma"] = float(gamma[site_index] if isinstance(gamma, tuple) else gamma)
    if gammas and not super_model.selector_includes_global:
        kept = scores["foreground"].bool()  # Dice over images with foreground, as dice-super
        metrics["dice-super-sweep"] = [
            float(routed_scores(scores["confidence"], scores["routed"], scores["global"], g)[kept].double().mean())
            for g in gammas
        ]
        metrics["share-global-sweep"] = [float((~is_confident(scores["confidence"], g)).double().mean())
                                         for g in gammas]
        gains, counts = model_sweeps(scores, len(super_model.personalized), gammas)
        metrics["routing-gain-sweep"], metrics["routed-count-sweep"] = gains, counts
    if routing:
        metrics.update(routing_cells(scores["super-route"], scores["super"], scores["foreground"]))
    return metrics


ROUTED_COUNT = "num-routed-"  # a count: pooling adds it up over sites
ROUTED_DICE = "routed-dice-"  # not "dice-": its images are those routed so, not the site's


def route_label(route: int) -> str:
    """A route's name in metric keys: ``global`` or the personalized model's index."""
    return "global" if route == GLOBAL_ROUTE else str(route)


def routing_cells(routes: torch.Tensor, dice: torch.Tensor, foreground: torch.Tensor) -> dict[str, float]:
    """One site's row of the routing matrix: images per route taken, and their mean Dice.

    ``num-routed-<r>`` counts the images sent to route ``r`` (``global`` or a
    personalized model's index), ``routed-dice-<r>`` is the mean Dice of the
    model that segmented them, over those with foreground (absent when none has).
    """
    cells: dict[str, float] = {}
    kept = foreground.bool()
    for route in routes.unique().tolist():
        chosen = routes == route
        cells[ROUTED_COUNT + route_label(route)] = float(chosen.sum())
        if (chosen & kept).any():
            cells[ROUTED_DICE + route_label(route)] = float(dice[chosen & kept].double().mean())
    return cells


def model_sweeps(scores: dict[str, torch.Tensor], num_models: int,
                 gammas: Sequence[float]) -> tuple[list[float], list[float]]:
    """Per personalized model ``m`` and gamma ``g``: what routing to ``m`` gains over the global model.

    ``gain[m, g] = sum over images with foreground, argmax m and confidence > g of
    (Dice_m - Dice_global)`` and ``count[m, g]`` the number of images (with or
    without foreground) routed so, both flattened row by row (``m * len(gammas) + g``).
    Summed over sites they choose one gamma per model
    (:func:`fedsm_core.algorithms.fedsm.gamma.choose_model_gammas`), and restate a
    site's super-model Dice at any choice, ``Dice_global + sum_m gain[m, g_m] / n_fg``,
    and its share routed to the global model, ``1 - sum_m count[m, g_m] / n``.
    """
    difference = (scores["routed"] - scores["global"]).double()
    kept = scores["foreground"].bool()
    gains, counts = [], []
    for model in range(num_models):
        chosen = scores["site"] == model
        for gamma in gammas:
            routed = chosen & is_confident(scores["confidence"], gamma)
            gains.append(float(difference[routed & kept].sum()))
            counts.append(float(routed.sum()))
    return gains, counts


def _per_image_scores(
    super_model: SuperModel, site_index: int | None, data: SegArrays, batch_size: int, device: torch.device | str
) -> dict[str, torch.Tensor]:
    """Selector confidence and argmax, and Dice of the global, argmax-routed and own model, per image."""
    keys = ("confidence", "site", "global", "routed", "personal", "super", "super-route", "foreground",
            "global-any", "routed-any", "super-any", "personal-any")
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for images, masks in iterate_batches(data, batch_size, shuffle=False):
        images, masks = to_device(images, device), to_device(masks, device)
        probs = torch.softmax(super_model.selector(images), dim=1)
        routes = super_model.routes(probs)
        global_logits = super_model.global_model(images)
        global_dice, global_any = dice_per_image(global_logits, masks), predicts_foreground(global_logits)
        # The most likely site's model, whatever gamma: the candidate of Algorithm 2.
        site = routes if super_model.selector_includes_global else probs.argmax(dim=1)
        routed, routed_any = global_dice.clone(), global_any.clone()
        for index in site.unique().tolist():
            chosen = site == index
            if index != GLOBAL_ROUTE:
                logits = super_model.personalized[index](images[chosen])
                routed[chosen], routed_any[chosen] = dice_per_image(logits, masks[chosen]), predicts_foreground(logits)
        to_global = routes == GLOBAL_ROUTE
        parts["confidence"].append(probs.max(dim=1).values)
        parts["site"].append(site)
        parts["global"].append(global_dice)
        parts["routed"].append(routed)
        parts["super"].append(torch.where(to_global, global_dice, routed))
        parts["super-route"].append(routes)
        parts["foreground"].append(has_foreground(masks))
        parts["global-any"].append(global_any)
        parts["routed-any"].append(routed_any)
        parts["super-any"].append(torch.where(to_global, global_any, routed_any))
        if site_index is not None:
            logits = super_model.personalized[site_index](images)
            parts["personal"].append(dice_per_image(logits, masks))
            parts["personal-any"].append(predicts_foreground(logits))
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
        ``{name: mean Dice over images with foreground, "num-images": N, "num-empty": E}``
        and, when ``E > 0``, the empty images' false-positive rate
        (``empty-fp-global`` for ``name = "dice-global"``).
    """
    model.eval().to(device)
    scores = ImageScores()
    for images, masks in iterate_batches(data, batch_size, shuffle=False):
        scores.add(model(to_device(images, device)), to_device(masks, device))
    return {**scores.result(name), "num-images": float(len(data.images))}
