"""Every candidate model's Dice and the selector's output, per image, in one pass.

With these two tables any routing rule of the super model (Algorithm 2 at
any gamma, a selector without some site's output, a temperature-scaled
selector) is scored without running a network again: the routed Dice of an
image is the Dice of the model the rule picks for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedsm_core.algorithms.fedsm.super_model import SuperModel, route
from fedsm_core.data.arrays import SegArrays
from fedsm_core.metrics import dice_per_image
from fedsm_core.training.batches import iterate_batches

GLOBAL_COLUMN = 0  # column of the global model in ModelScores.dice


@dataclass(frozen=True, eq=False)
class ModelScores:
    """Per-image scores of one set of images.

    Attributes
    ----------
    dice : np.ndarray
        float64 ``[N, 1 + K]``: column 0 the global model, column ``1 + k``
        the personalized model of site ``k``.
    logits : np.ndarray
        float64 ``[N, K]`` selector logits (``K + 1`` for FedSM-extra).
    features : np.ndarray
        float32 ``[N, D]`` selector features (:meth:`Selector.embed`).
    ids : tuple of str
        Image ids.
    """

    dice: np.ndarray
    logits: np.ndarray
    features: np.ndarray
    ids: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.ids)


@torch.no_grad()
def score_every_model(model: SuperModel, data: SegArrays, batch_size: int = 16,
                      device: torch.device | str = "cpu") -> ModelScores:
    """Run the global model, every personalized model and the selector on ``data``."""
    model = model.to(device).eval()
    dice, logits, features = [], [], []
    for images, masks in iterate_batches(data, batch_size, shuffle=False):
        images, masks = images.to(device), masks.to(device)
        candidates = [model.global_model, *model.personalized]
        dice.append(torch.stack([dice_per_image(m(images), masks) for m in candidates], dim=1).cpu())
        embedded = model.selector.embed(images)
        features.append(embedded.cpu())
        logits.append(model.selector.classifier(embedded).cpu())
    return ModelScores(torch.cat(dice).double().numpy(), torch.cat(logits).double().numpy(),
                       torch.cat(features).float().numpy(), tuple(data.ids))


@torch.no_grad()
def selector_features(model: SuperModel, data: SegArrays, batch_size: int = 16,
                      device: torch.device | str = "cpu") -> np.ndarray:
    """float64 ``[N, D]`` selector embeddings of ``data`` (no U-Net runs)."""
    selector = model.selector.to(device).eval()
    parts = [selector.embed(images.to(device)).cpu() for images, _ in iterate_batches(data, batch_size, shuffle=False)]
    return torch.cat(parts).double().numpy()


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``logits / temperature`` in float64."""
    if temperature <= 0:
        raise ValueError(f"temperature = {temperature} must be > 0")
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def route_images(probs: np.ndarray, gamma: float | tuple[float, ...]) -> np.ndarray:
    """Algorithm 2 on probabilities: site index, or -1 (global) when ``max(p) <= gamma`` (of that site's model)."""
    return route(torch.from_numpy(np.asarray(probs, dtype=np.float64)), gamma).numpy()


def routed_dice(dice: np.ndarray, routes: np.ndarray) -> np.ndarray:
    """Per-image Dice of the routed model (route -1 = global, k = site k's model)."""
    return dice[np.arange(len(routes)), routes + 1]


def selection_frequencies(routes: np.ndarray, site_names: tuple[str, ...]) -> dict[str, float]:
    """Share of images sent to the global model and to each site's model (sums to 1)."""
    n = max(len(routes), 1)
    shares = {"global": float(np.sum(routes == -1)) / n}
    shares.update({name: float(np.sum(routes == k)) / n for k, name in enumerate(site_names)})
    return shares


def dice_by_gamma(dice: np.ndarray, probs: np.ndarray, gammas) -> list[float]:
    """Mean routed Dice at each gamma of ``gammas``."""
    return [float(routed_dice(dice, route_images(probs, g)).mean()) for g in gammas]
