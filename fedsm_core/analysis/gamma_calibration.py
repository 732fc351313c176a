"""Choosing gamma for sites that did not take part in training, without their data.

FedSM's threshold gamma decides when the selector is too unsure to trust a
personalized model (Algorithm 2). On the training sites' own validation data
the selector is nearly always sure, so a gamma chosen there says nothing
about an unseen hospital. The paper sets gamma by hand.

Here the unseen case is simulated on validation data of the training sites:
for each training site ``j`` its validation images are routed by the selector
with site ``j``'s output removed (probabilities renormalised over the other
sites), so they must go to another site's model or to the global model, as
a new hospital's images would. The Dice-versus-gamma curves of all ``j`` are
pooled (weighted by image count) and the best gamma is chosen (ties go to the
smallest) among the *safe* ones: those at which no left-out site's Dice falls
more than ``tolerance`` (0.3 points) below its global model's. ``gamma = 1``
routes everything to the global model, so a safe gamma always exists. The
pooled optimum alone is not enough: one left-out site that gains much can pay
for routes that cost every other left-out site, and an unseen hospital may be
one of the others. Optionally the selector is first temperature-scaled (Guo et al.
2017), where that confidence is used: on the same left-out probabilities, one
temperature ``T`` minimising the negative log-likelihood of each image's best
remaining model (the other site whose personalized model segments it best).
The calibrated confidence is then the probability that the chosen model is
the best one a new hospital's image can get, which is what gamma thresholds.
Fitting on the sites' own labels instead measures how sure the selector is of
an image's *own* site, a question no unseen image asks: there it drove ``T``
to the grid's floor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID, choose_gamma, pool_sweeps
from fedsm_core.analysis.familiarity import SiteRegions
from fedsm_core.analysis.model_scores import ModelScores, route_images, routed_dice, softmax

# 10^-3 .. 10^3 in 121 steps of 10^0.05: a fitted head can be far more or far less sure than it should be,
# and the fit must not stop at an end of the grid.
TEMPERATURE_GRID: tuple[float, ...] = tuple(float(t) for t in np.round(np.logspace(-3, 3, 121), 6))


def drop_site(probs: np.ndarray, site: int) -> np.ndarray:
    """Probabilities with column ``site`` set to 0 and rows renormalised.

    The column is kept (zeroed) so site indices keep their meaning.
    """
    if probs.shape[1] < 2:
        raise ValueError("drop_site needs a selector with two or more sites")
    out = np.array(probs, dtype=np.float64, copy=True)
    out[:, site] = 0.0
    total = out.sum(axis=1, keepdims=True)
    uniform = np.full_like(out, 1.0 / (out.shape[1] - 1))
    uniform[:, site] = 0.0
    return np.where(total > 0, out / np.where(total > 0, total, 1.0), uniform)


def gated_routes(probs: np.ndarray, gamma: float | tuple[float, ...], features: np.ndarray,
                 regions: SiteRegions | None) -> np.ndarray:
    """Algorithm 2's routes, with images unfamiliar to their chosen site sent to the global model.

    Without ``regions`` these are :func:`route_images`' routes (see
    :mod:`fedsm_core.analysis.familiarity`).
    """
    routes = route_images(probs, gamma)
    if regions is None:
        return routes
    return np.where(regions.familiar(features, routes), routes, -1)


def unseen_site_curves(val_scores: Mapping[str, ModelScores], site_names: Sequence[str],
                       gammas: Sequence[float] = GAMMA_GRID, temperature: float = 1.0,
                       regions: SiteRegions | None = None) -> dict[str, list[float]]:
    """Per training site ``j``: routed Dice versus gamma on ``j``'s validation images, ``j`` left out.

    Parameters
    ----------
    val_scores : mapping
        Site name -> its validation :class:`ModelScores` under the super model.
    site_names : sequence of str
        The selector's sites, in output order.
    regions : SiteRegions, optional
        Route only images familiar to their chosen site (:func:`gated_routes`).
    """
    curves = {}
    for name, scores in val_scores.items():
        if name not in site_names:
            raise ValueError(f"validation scores of '{name}', which is not a selector site {list(site_names)}")
        probs = drop_site(softmax(scores.logits, temperature), list(site_names).index(name))
        curves[name] = [float(routed_dice(scores.dice, gated_routes(probs, g, scores.features, regions)).mean())
                        for g in gammas]
    return curves


SAFETY_TOLERANCE = 0.003  # 0.3 Dice points: how far below its global model a left-out site may fall


def calibrate_gamma(val_scores: Mapping[str, ModelScores], site_names: Sequence[str],
                    gammas: Sequence[float] = GAMMA_GRID, temperature: float = 1.0,
                    tolerance: float = SAFETY_TOLERANCE,
                    regions: SiteRegions | None = None) -> tuple[float, list[float]]:
    """The safe gamma with the best pooled unseen-site curve, and that pooled curve.

    A gamma is safe when every left-out site ``j`` keeps
    ``curve_j(gamma) >= Dice_global(j) - tolerance``; unsafe gammas are not
    chosen, whatever their pooled value (``gammas`` must include 1.0, which is
    always safe).
    """
    if 1.0 not in gammas:
        raise ValueError("calibrate_gamma: the grid must include gamma = 1 (everything to the global model)")
    curves = unseen_site_curves(val_scores, site_names, gammas, temperature, regions)
    pooled = pool_sweeps({n: (c, len(val_scores[n])) for n, c in curves.items()}, gammas)
    global_dice = {n: float(val_scores[n].dice[:, 0].mean()) for n in curves}
    safe = [all(curves[n][i] >= global_dice[n] - tolerance for n in curves) for i in range(len(gammas))]
    candidates = [value if ok else -np.inf for value, ok in zip(pooled, safe, strict=True)]
    return choose_gamma(candidates, gammas), pooled


def negative_log_likelihood(logits: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """Mean ``-log softmax(logits / T)[label]`` in float64."""
    probs = softmax(logits, temperature)
    picked = probs[np.arange(len(labels)), np.asarray(labels, dtype=int)]
    return float(-np.log(np.clip(picked, 1e-300, None)).mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray, grid: Sequence[float] = TEMPERATURE_GRID) -> float:
    """Temperature scaling: the ``T`` of ``grid`` with the lowest validation NLL.

    ``logits`` may hold ``-inf`` for outputs that are excluded (a left-out site).
    """
    if len(labels) == 0:
        raise ValueError("fit_temperature needs at least one labelled image")
    losses = [negative_log_likelihood(logits, labels, t) for t in grid]
    return float(grid[int(np.argmin(losses))])


def unseen_site_labelled_logits(val_scores: Mapping[str, ModelScores],
                                site_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Leave-own-site-out logits and each image's best remaining model, for fitting the temperature.

    For an image of site ``j``, output ``j`` is set to ``-inf`` (its softmax is
    :func:`drop_site`'s renormalisation) and the label is the site ``k != j``
    whose personalized model has the highest Dice on it (ties: the lowest ``k``).
    """
    logits, labels = [], []
    names = list(site_names)
    for name, scores in val_scores.items():
        if name not in names:
            raise ValueError(f"validation scores of '{name}', which is not a selector site {names}")
        own = names.index(name)
        masked = np.array(scores.logits, dtype=np.float64, copy=True)
        masked[:, own] = -np.inf
        personal = np.array(scores.dice[:, 1:], dtype=np.float64, copy=True)
        personal[:, own] = -np.inf
        logits.append(masked)
        labels.append(personal.argmax(axis=1))
    return np.concatenate(logits), np.concatenate(labels)


def fit_unseen_temperature(val_scores: Mapping[str, ModelScores], site_names: Sequence[str],
                           grid: Sequence[float] = TEMPERATURE_GRID) -> float:
    """The selector temperature for unseen sites: :func:`fit_temperature` on :func:`unseen_site_labelled_logits`."""
    return fit_temperature(*unseen_site_labelled_logits(val_scores, site_names), grid=grid)

