"""Evaluation of the FedSM super model on one site's images."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsm_core.algorithms.fedsm.needed_models import routing_probabilities
from fedsm_core.algorithms.fedsm.super_model import GLOBAL_ROUTE, SuperModel, is_confident, routed_scores
from fedsm_core.data.arrays import SegArrays
from fedsm_core.device import to_device
from fedsm_core.evaluation.case_scores import CaseMasks
from fedsm_core.metrics import ImageScores, dice_per_structure, has_foreground, split_scores
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
    route_by: str = "image",
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
    route_by : {"image", "case"}
        Algorithm 2 per image, or once per case (``route-by``,
        :func:`~fedsm_core.algorithms.fedsm.super_model.selector_probabilities`);
        with ``"case"`` the confidence and candidate of every slice (and so the
        sweeps) are its case's.

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
        When the ids name cases, also the per-case 3-D Dice and HD95 of the
        global, personalized and super model (:mod:`fedsm_core.evaluation.case_scores`:
        ``case-dice-*``, ``case-hd95-*`` (``case-hd95-mm-*`` where the cases have a spacing),
        ``num-missed-cases-*``, ``num-cases``,
        ``num-empty-cases``); the super model's only without a sweep, since
        its gamma is then chosen after this evaluation.
    """
    super_model = super_model.eval().to(device)
    probs = routing_probabilities(super_model.selector, data, batch_size, device, route_by)
    cases = CaseMasks(data.ids)
    scores = _per_image_scores(super_model, site_index, data, probs, cases, batch_size, device)
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
    metrics.update(cases.result(data.masks, ("global", "personal") if gammas else None, data.spacings))
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


def _per_image_scores(super_model: SuperModel, site_index: int | None, data: SegArrays, probs: torch.Tensor,
                      cases: CaseMasks, batch_size: int, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Selector confidence and candidate, and Dice of the global, candidate and own model, per image.

    ``probs`` are the routing probabilities of every image (per image or per
    case); the predicted masks go to ``cases`` as ``global``, ``super`` and ``personal``.
    """
    parts: dict[str, list[torch.Tensor]] = {}
    start = 0
    for images, masks in iterate_batches(data, batch_size, shuffle=False):
        images, masks = to_device(images, device), to_device(masks, device)
        batch_probs, start = to_device(probs[start:start + len(images)], device), start + len(images)
        scores, predicted = _batch_scores(super_model, site_index, images, masks, batch_probs)
        for key, value in scores.items():
            parts.setdefault(key, []).append(value)
        for model, mask in predicted.items():
            cases.add(model, mask)
    return {key: torch.cat(values).cpu() for key, values in parts.items()}


def _batch_scores(super_model: SuperModel, site_index: int | None, images: torch.Tensor, masks: torch.Tensor,
                  probs: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One batch's per-image scores (:func:`_per_image_scores`) and predicted masks per model."""
    routes = super_model.routes(probs)
    global_logits = super_model.global_model(images)
    global_pred = torch.sigmoid(global_logits) > 0.5
    # The most likely site's model, whatever gamma: the candidate of Algorithm 2.
    site = routes if super_model.selector_includes_global else probs.argmax(dim=1)
    routed_pred = global_pred.clone()
    for index in site.unique().tolist():
        chosen = site == index
        if index != GLOBAL_ROUTE:
            routed_pred[chosen] = torch.sigmoid(super_model.personalized[index](images[chosen])) > 0.5
    to_global = (routes == GLOBAL_ROUTE).view(-1, 1, 1, 1)
    predicted = {"global": global_pred, "super": torch.where(to_global, global_pred, routed_pred)}
    if site_index is not None:
        predicted["personal"] = torch.sigmoid(super_model.personalized[site_index](images)) > 0.5
    scores = {"confidence": probs.max(dim=1).values, "site": site, "super-route": routes,
              "foreground": has_foreground(masks), "routed": _hard_dice(routed_pred, masks),
              "routed-any": routed_pred.flatten(1).any(dim=1)}
    for model, pred in predicted.items():
        scores[model] = _hard_dice(pred, masks)
        scores[f"{model}-any"] = pred.flatten(1).any(dim=1)
    return scores, predicted


def _hard_dice(pred: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Per-image Dice of binary predictions, as :func:`fedsm_core.metrics.dice_per_image` of their logits."""
    return dice_per_structure(pred, masks).mean(dim=1)


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
        (``empty-fp-global`` for ``name = "dice-global"``); when the ids name
        cases, also ``case-dice-global``, ``case-hd95-global``,
        ``num-missed-cases-global``, ``num-cases`` and ``num-empty-cases``
        (:mod:`fedsm_core.evaluation.case_scores`).
    """
    model.eval().to(device)
    scores, cases = ImageScores(), CaseMasks(data.ids)
    for images, masks in iterate_batches(data, batch_size, shuffle=False):
        logits = model(to_device(images, device))
        scores.add(logits, to_device(masks, device))
        cases.add(name.removeprefix("dice-"), torch.sigmoid(logits) > 0.5)
    return {**scores.result(name), "num-images": float(len(data.images)),
            **cases.result(data.masks, spacings=data.spacings)}
