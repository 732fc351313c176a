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
smallest). Optionally the selector is first temperature-scaled: one
temperature ``T`` minimising the negative log-likelihood of the site labels
on validation (Guo et al. 2017), so that its confidence is calibrated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedsm_core.algorithms.gamma import GAMMA_GRID, choose_gamma, pool_sweeps
from fedsm_core.algorithms.model_scores import ModelScores, route_images, routed_dice, softmax

TEMPERATURE_GRID: tuple[float, ...] = tuple(float(t) for t in np.round(np.logspace(-1, 1, 41), 4))


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


def unseen_site_curves(val_scores: Mapping[str, ModelScores], site_names: Sequence[str],
                       gammas: Sequence[float] = GAMMA_GRID, temperature: float = 1.0) -> dict[str, list[float]]:
    """Per training site ``j``: routed Dice versus gamma on ``j``'s validation images, ``j`` left out.

    Parameters
    ----------
    val_scores : mapping
        Site name -> its validation :class:`ModelScores` under the super model.
    site_names : sequence of str
        The selector's sites, in output order.
    """
    curves = {}
    for name, scores in val_scores.items():
        if name not in site_names:
            raise ValueError(f"validation scores of '{name}', which is not a selector site {list(site_names)}")
        probs = drop_site(softmax(scores.logits, temperature), list(site_names).index(name))
        curves[name] = [float(routed_dice(scores.dice, route_images(probs, g)).mean()) for g in gammas]
    return curves


def calibrate_gamma(val_scores: Mapping[str, ModelScores], site_names: Sequence[str],
                    gammas: Sequence[float] = GAMMA_GRID, temperature: float = 1.0) -> tuple[float, list[float]]:
    """The gamma with the best pooled unseen-site curve, and that pooled curve."""
    curves = unseen_site_curves(val_scores, site_names, gammas, temperature)
    pooled = pool_sweeps({n: (c, len(val_scores[n])) for n, c in curves.items()}, gammas)
    return choose_gamma(pooled, gammas), pooled


def negative_log_likelihood(logits: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """Mean ``-log softmax(logits / T)[label]`` in float64."""
    probs = softmax(logits, temperature)
    picked = probs[np.arange(len(labels)), np.asarray(labels, dtype=int)]
    return float(-np.log(np.clip(picked, 1e-300, None)).mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray, grid: Sequence[float] = TEMPERATURE_GRID) -> float:
    """Temperature scaling: the ``T`` of ``grid`` with the lowest validation NLL."""
    if len(labels) == 0:
        raise ValueError("fit_temperature needs at least one labelled image")
    losses = [negative_log_likelihood(logits, labels, t) for t in grid]
    return float(grid[int(np.argmin(losses))])


def site_labelled_logits(val_scores: Mapping[str, ModelScores],
                         site_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """All validation logits stacked, with each image's own site index as label."""
    logits = np.concatenate([s.logits for s in val_scores.values()])
    labels = np.concatenate([np.full(len(s), list(site_names).index(n)) for n, s in val_scores.items()])
    return logits, labels
