"""Test images with ground-truth and predicted contours, drawn where the images are: at the site.

Images never leave a site in a real deployment, so the report's overlays are
drawn by each site during its own test evaluation. In simulation the site
writes them into the run folder (``overlays/<site>.png``); in deployment into
a folder on its own machine (:func:`overlay_folder`), and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from fedsm_core.algorithms.fedsm.needed_models import routing_probabilities
from fedsm_core.algorithms.fedsm.super_model import GLOBAL_ROUTE, SuperModel
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.case_scores import group_cases
from fedsm_core.metrics import dice_per_image

OVERLAY_IMAGES = 3  # enough to see a site's typical result and one more; a page of six sites stays short
# Colours that stand out on red fundus photographs and on grey MR slices alike.
TRUTH_COLOUR = "#76ff03"  # green: ground truth
PREDICTION_COLOUR = "#00e5ff"  # cyan, dashed: the routed model's prediction
DEPLOYMENT_FOLDER = "fedsm-overlays"  # relative to the SuperNode's working directory
OVERLAY_DIR = "overlay-dir"  # key of the test evaluation's config (the run folder's overlays/) and of a node config

Predictor = Callable[[SegArrays, list[int], "torch.device | str"], tuple[torch.Tensor, list[str]]]
"""(split, indices of the images to draw, device) -> (their logits ``[B, S, H, W]``, the model that segmented each).

The whole split comes along because a case is routed from all its slices (``route-by = "case"``)."""


def overlay_folder(node_config: dict[str, object], sent_folder: str, run_id: int) -> tuple[Path | None, bool]:
    """Where a site writes its overlays, and whether that is the run folder (simulation).

    The server asks for overlays by naming the run folder's ``overlays/`` in
    the test evaluation (``sent_folder``; empty: no overlays, ``None``). A
    simulated node (``partition-id`` in its node config, no ``site-name``)
    shares the machine with the ServerApp and writes there. A deployed
    SuperNode writes to its node config's ``overlay-dir`` (default
    ``fedsm-overlays`` in its working directory), under ``run-<run id>``:
    its images stay on its machine.
    """
    if not sent_folder:
        return None, False
    if "site-name" not in node_config and "partition-id" in node_config:
        return Path(sent_folder), True
    base = Path(str(node_config.get(OVERLAY_DIR, DEPLOYMENT_FOLDER))).expanduser()
    return base / f"run-{run_id}", False


def choose_images(data: SegArrays, count: int = OVERLAY_IMAGES) -> list[int]:
    """The images to draw: the same ones every run.

    Without cases, the first ``count`` images with foreground (then empty
    ones if too few). When the ids name cases (slices of volumes), one slice
    per case first, the one with the most foreground (the gland's widest
    section), cases in order, so the panels show different patients.
    """
    foreground = [i for i in range(len(data)) if data.masks[i].any()]
    empty = [i for i in range(len(data)) if not data.masks[i].any()]
    cases = group_cases(data.ids)
    if cases:
        area = {i: float(data.masks[i].sum()) for i in foreground}
        widest = []
        for rows in cases.values():
            shown = [row for row in rows if row in area]
            if shown:  # ties: the earliest slice
                widest.append(max(shown, key=lambda row: (area[row], -row)))
        foreground = widest + [i for i in foreground if i not in widest]
    return (foreground + empty)[:count]


def super_model_predictor(super_model: SuperModel, site_names: Sequence[str], route_by: str = "image",
                          batch_size: int = 16) -> Predictor:
    """Algorithm 2's routed prediction, per image or per case as the evaluation routes, with the routed model named.

    With ``route-by = "case"`` every slice of a case takes the case's route
    (:func:`~fedsm_core.algorithms.fedsm.needed_models.routing_probabilities` over the whole split).
    """

    def predict(data: SegArrays, chosen: list[int], device: torch.device | str) -> tuple[torch.Tensor, list[str]]:
        probs = routing_probabilities(super_model.selector, data, batch_size, device, route_by)[chosen]
        routes = super_model.routes(probs.to(device))
        logits = super_model.segment(torch.from_numpy(data.images[chosen]).to(device), routes)
        suffix = " (whole case)" if route_by == "case" else ""
        return logits, [("global" if r == GLOBAL_ROUTE else site_names[r]) + suffix for r in routes.tolist()]

    return predict


def model_predictor(model: torch.nn.Module, name: str = "global") -> Predictor:
    """One model for every image (FedAvg and the other single-model strategies)."""
    return lambda data, chosen, device: (model(torch.from_numpy(data.images[chosen]).to(device)), [name] * len(chosen))


@torch.no_grad()
def write_site_overlays(predict: Predictor, data: SegArrays, site: str, folder: str | Path,
                        device: torch.device | str = "cpu", count: int = OVERLAY_IMAGES) -> Path | None:
    """Draw ``count`` test images of one site with both contours into ``<folder>/<site>.png``.

    Returns the PNG's path, or ``None`` when the split has no images.
    """
    chosen = choose_images(data, count)
    if not chosen:
        return None
    masks = torch.from_numpy(data.masks[chosen]).to(device)
    logits, routed = predict(data, chosen, device)
    predicted = (logits > 0).float()  # sigmoid(logit) > 0.5, as the Dice metrics threshold
    dice = dice_per_image(logits, masks).cpu().tolist()
    titles = [f"{data.ids[i]}\nrouted to {name}, Dice {score:.3f}" for i, name, score
              in zip(chosen, routed, dice, strict=True)]
    path = Path(folder) / f"{site}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    draw_overlays(data.images[chosen], data.masks[chosen], predicted.cpu().numpy(), titles, path)
    return path


def draw_overlays(images: np.ndarray, truth: np.ndarray, predicted: np.ndarray, titles: Sequence[str],
                  path: Path) -> Path:
    """One panel per image: the image, ground-truth contours (green) and predicted ones (cyan, dashed).

    Parameters
    ----------
    images : np.ndarray
        ``[N, C, H, W]`` in ``[0, 1]`` (C = 1 grey or 3 RGB).
    truth, predicted : np.ndarray
        Binary masks ``[N, S, H, W]``; every structure is drawn.
    """
    figure = Figure(figsize=(2.5 * len(images), 3.0), dpi=100)
    # Fixed margins (room for two title lines and the suptitle): the constrained layout engine drew the same
    # panels about 40 % slower, and every site draws this page at every test evaluation.
    figure.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=0.78, wspace=0.08)
    for index, axis in enumerate(figure.subplots(1, len(images), squeeze=False)[0]):
        picture = np.clip(np.moveaxis(images[index], 0, -1), 0.0, 1.0)
        axis.imshow(picture[..., 0] if picture.shape[-1] == 1 else picture[..., :3], cmap="gray",
                    interpolation="nearest")
        for masks, colour, style in ((truth, TRUTH_COLOUR, "solid"), (predicted, PREDICTION_COLOUR, "dashed")):
            for structure in masks[index]:
                if structure.any() and not structure.all():  # a contour needs both levels
                    axis.contour(structure, levels=[0.5], colors=colour, linewidths=1.4, linestyles=style)
        axis.set_title(titles[index], fontsize=8)
        axis.set_axis_off()
    figure.suptitle("green: ground truth, cyan dashed: prediction", fontsize=9)
    figure.savefig(path)
    return path
