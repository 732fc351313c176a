"""How a super model serves a site that did not take part in training (paper Table 5).

Given a super model trained on K sites and the test images of a site outside
them, :func:`analyse_held_out` reports which models the selector routes the
images to (global or a site's personalized model) and the Dice of every
candidate model and of the super model at four thresholds:

* ``gamma = 0``: always trust the selector;
* the bundle's gamma, chosen on the training sites' own validation data;
* the calibrated gamma, chosen on the training sites' validation data with
  each site left out of the selector in turn (:mod:`gamma_calibration`),
  applied with the temperature fitted there and, when site regions are
  given, only to images familiar to their chosen site (:mod:`familiarity`);
* the local gamma, when the held-out site has labelled validation images of
  its own (a new hospital labels a few to join): the best on them, ties to
  the smallest; never below its global model on them, since gamma = 1 is
  the global model;
* the oracle gamma, the best on the held-out test images themselves:
  reported as a reference and never used to choose anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID, choose_gamma
from fedsm_core.algorithms.fedsm.super_model import check_gamma
from fedsm_core.analysis.familiarity import SiteRegions
from fedsm_core.analysis.gamma_calibration import calibrate_gamma, fit_unseen_temperature, gated_routes
from fedsm_core.analysis.model_scores import (
    ModelScores,
    dice_by_gamma,
    route_images,
    routed_dice,
    selection_frequencies,
    softmax,
)


@dataclass
class HeldOutResult:
    """Routing and Dice of a super model on one held-out site's test images.

    Attributes
    ----------
    gammas : dict
        ``"zero"``, ``"bundle"``, ``"calibrated"``, ``"oracle"`` -> gamma (the
        bundle's may hold one per training site's model).
    temperature : float
        Selector temperature used with the calibrated gamma (1.0 = none).
    frequencies : dict
        Gamma kind -> share of images per model (``"global"`` and site names).
    dice : dict
        ``"global"``, each site name (its personalized model) and
        ``"super@<kind>"`` -> mean Dice on the held-out test images.
    curve : list of float
        Super-model Dice at each gamma of ``gamma_grid`` (held-out test).
    calibration_curve : list of float
        The pooled unseen-site validation curve the calibrated gamma came from.
    """

    site: str
    num_images: int
    gamma_grid: tuple[float, ...]
    gammas: dict[str, float | tuple[float, ...]] = field(default_factory=dict)
    temperature: float = 1.0
    frequencies: dict[str, dict[str, float]] = field(default_factory=dict)
    dice: dict[str, float] = field(default_factory=dict)
    curve: list[float] = field(default_factory=list)
    calibration_curve: list[float] = field(default_factory=list)


def analyse_held_out(site: str, test: ModelScores, val: Mapping[str, ModelScores], site_names: Sequence[str],
                     bundle_gamma: float | tuple[float, ...], temperature_scaling: bool = True,
                     gamma_grid: Sequence[float] = GAMMA_GRID, regions: SiteRegions | None = None,
                     site_val: ModelScores | None = None) -> HeldOutResult:
    """Score the routing of ``test`` (held-out site) under four gamma choices.

    Parameters
    ----------
    test : ModelScores
        Scores of the held-out site's test images.
    val : mapping
        Training site -> scores of its validation images (for calibration).
    site_names : sequence of str
        The selector's sites (training sites) in output order.
    temperature_scaling : bool
        Fit the selector's temperature on ``val`` with each site left out
        (:func:`~fedsm_core.analysis.gamma_calibration.fit_unseen_temperature`)
        before calibrating gamma; the same temperature is then applied to ``test``.
    regions : SiteRegions, optional
        The training sites' embedding regions: the calibrated routing (in
        calibration and on ``test``) sends images unfamiliar to their chosen
        site to the global model.
    site_val : ModelScores, optional
        Scores of the held-out site's own labelled validation images: adds the ``local`` gamma.
    """
    result = HeldOutResult(site, len(test), tuple(gamma_grid))
    if temperature_scaling:
        result.temperature = fit_unseen_temperature(val, site_names)
    calibrated, result.calibration_curve = calibrate_gamma(val, site_names, gamma_grid, result.temperature,
                                                           regions=regions)
    probs = softmax(test.logits)
    scaled = softmax(test.logits, result.temperature)
    result.curve = dice_by_gamma(test.dice, probs, gamma_grid)
    result.gammas = {"zero": 0.0, "bundle": check_gamma(bundle_gamma), "calibrated": calibrated,
                     "oracle": choose_gamma(result.curve, gamma_grid)}
    if site_val is not None and len(site_val):
        result.gammas["local"] = choose_gamma(dice_by_gamma(site_val.dice, softmax(site_val.logits), gamma_grid),
                                              gamma_grid)
    result.dice["global"] = float(test.dice[:, 0].mean())
    result.dice.update({name: float(test.dice[:, k + 1].mean()) for k, name in enumerate(site_names)})
    for kind, gamma in result.gammas.items():
        routes = gated_routes(scaled, gamma, test.features, regions) if kind == "calibrated" \
            else route_images(probs, gamma)
        result.frequencies[kind] = selection_frequencies(routes, tuple(site_names))
        result.dice[f"super@{kind}"] = float(routed_dice(test.dice, routes).mean())
    return result


def project_2d(features: np.ndarray) -> np.ndarray:
    """PCA of ``[N, D]`` features onto their first two principal axes, ``[N, 2]``.

    The features are standardised per dimension first, so no single large
    feature dominates the picture (the paper's Figure 3 uses t-SNE; PCA keeps
    the picture deterministic and needs no extra library).
    """
    x = np.asarray(features, dtype=np.float64)
    x = (x - x.mean(axis=0)) / np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)
    _, _, axes = np.linalg.svd(x, full_matrices=False)
    return x @ axes[:2].T
