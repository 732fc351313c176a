"""Test Dice of every image for the model a finished run deploys: what a bootstrap over images needs.

A run reports per-site means (``metrics.csv``); a confidence interval over
test images needs the Dice of each image. :func:`write_image_dice` scores the
run folder's deployed model once more on every test image, with the same
code the ClientApp reports with, and writes ``test-images.csv`` into the run
folder (columns :data:`COLUMNS`):

* ``global`` family (FedAvg, FedProx, SCAFFOLD, HarmoFL): ``global_model.pt``;
  with ``knn-per = true`` the kNN-Per prediction of that model (datastore
  from the site's training split, ``lam`` chosen on its validation split,
  seeded as the client does), the score kNN-Per reports;
* ``site-models`` family (FedBN): each site's own ``site_models/<site>.pt``;
* ``fedsm`` family: ``super_model.pt`` routed by Algorithm 2 at the run's
  gamma (FedSM-extra: the argmax of its ``K + 1`` selector outputs), per
  image or per case as the run's ``route-by``.

The mean over a site's images with foreground is the ``dice-*`` value the run
reported for that site (:func:`fedsm_core.metrics.ImageScores`), so the two
can be checked against each other (:func:`site_means`).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import torch

from fedsm_core.algorithms.fedsm.super_model import selector_probabilities
from fedsm_core.algorithms.knn_per.knn_per import KNNPer, dice_per_lambda
from fedsm_core.algorithms.knn_per.settings import KNNPerSettings
from fedsm_core.analysis.model_scores import routed_dice, score_every_model
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SegArrays, SiteSplits
from fedsm_core.data.cases import named_case
from fedsm_core.data.registry import training_dataset
from fedsm_core.methods import METHODS
from fedsm_core.metrics import dice_per_image, has_foreground
from fedsm_core.run_files.bundle import load_bundle
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, load_checkpoint
from fedsm_core.run_files.model_files import load_global_model
from fedsm_core.training.batches import iterate_batches

IMAGE_DICE_FILE = "test-images.csv"
COLUMNS = ("site", "image", "foreground", "dice")
ImageRow = tuple[str, str, bool, float]
SiteScorer = Callable[[int, SiteSplits], np.ndarray]  # (site index, splits) -> Dice per test image


@torch.no_grad()
def model_image_dice(model: torch.nn.Module, data: SegArrays, batch_size: int = 16,
                     device: torch.device | str = "cpu") -> np.ndarray:
    """float64 ``[N]``: Dice (mean over structures) of one segmentation model on every image of ``data``."""
    model = model.eval().to(device)
    parts = [dice_per_image(model(images.to(device)), masks.to(device)).cpu()
             for images, masks in iterate_batches(data, batch_size, shuffle=False)]
    return torch.cat(parts).numpy()


@torch.no_grad()
def knn_per_image_dice(model: torch.nn.Module, site: SiteSplits, settings: KNNPerSettings,
                       device: torch.device | str = "cpu") -> np.ndarray:
    """float64 ``[N]``: kNN-Per's Dice on every test image of ``site`` (build, choose ``lam``, score)."""
    knn = KNNPer(model, settings, device).build(site.train)
    knn.choose_lambda(site.val)
    parts = []
    for images, masks in iterate_batches(site.test, settings.batch_size, shuffle=False):
        p_knn, p_model = knn.probabilities(images)
        parts.append(dice_per_lambda(p_knn, p_model, masks.to(knn.device), (knn.lam,))[:, 0].cpu())
    return torch.cat(parts).numpy()


def image_rows(sites: Iterable[SiteSplits], score: SiteScorer) -> list[ImageRow]:
    """One row per test image of every site: site, image id, whether it has foreground, Dice."""
    rows: list[ImageRow] = []
    for index, site in enumerate(sites):
        dice = score(index, site)
        foreground = has_foreground(torch.from_numpy(np.asarray(site.test.masks))).numpy()
        if len(dice) != len(site.test.ids):
            raise ValueError(f"site {site.name}: {len(dice)} Dice values for {len(site.test.ids)} test images")
        rows += [(site.name, image, bool(fg), float(d))
                 for image, fg, d in zip(site.test.ids, foreground, dice, strict=True)]
    return rows


def deployed_scorer(folder: Path, config: RunConfig, device: torch.device | str = "cpu") -> SiteScorer:
    """The per-image scorer of the model ``folder`` deploys, by the family of its strategy."""
    family = METHODS[config.strategy].family
    batch = config.batch_size * 2
    if family == "fedsm":
        model, _ = load_bundle(folder / "super_model.pt", device)

        route_by = config.fedsm_settings.route_by

        def super_model(index: int, site: SiteSplits) -> np.ndarray:
            scores = score_every_model(model, site.test, batch, device)
            cases = [named_case(example) for example in scores.ids]
            routes = model.routes(selector_probabilities(torch.from_numpy(scores.logits), cases, route_by)).numpy()
            return routed_dice(scores.dice, routes)

        return super_model
    if family == "site-models":
        return lambda index, site: model_image_dice(
            load_global_model(folder / "site_models" / f"{site.name}.pt", device)[0], site.test, batch, device)
    model, _ = load_global_model(folder / "global_model.pt", device)
    if config.knn_per:
        settings = config.knn_settings
        return lambda index, site: knn_per_image_dice(model, site, settings, device)
    return lambda index, site: model_image_dice(model, site.test, batch, device)


def run_sites(config: RunConfig) -> list[SiteSplits]:
    """The training sites of a run, loaded as its clients load them."""
    info = training_dataset(config.dataset, config.held_out_site)
    return [info.load_site(i, config.image_size, config.data_scale, config.data_seed) for i in range(info.num_sites)]


def write_rows(path: Path, rows: Iterable[ImageRow]) -> Path:
    """``rows`` as a CSV with :data:`COLUMNS`."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows((site, image, int(fg), repr(dice)) for site, image, fg, dice in rows)
    return path


def read_rows(path: Path) -> list[ImageRow]:
    """Rows of a file written by :func:`write_rows`."""
    with path.open(newline="") as handle:
        return [(r["site"], r["image"], r["foreground"] == "1", float(r["dice"])) for r in csv.DictReader(handle)]


def write_image_dice(folder: str | Path, device: torch.device | str = "cpu") -> Path:
    """Score a finished run folder's deployed model per test image; returns ``<folder>/test-images.csv``.

    Raises
    ------
    FileNotFoundError
        When the folder has no ``checkpoint.pt`` or no model file (the run did not finish).
    """
    folder = Path(folder)
    config = RunConfig.from_mapping(load_checkpoint(folder / CHECKPOINT_FILE)["run-config"])
    rows = image_rows(run_sites(config), deployed_scorer(folder, config, device))
    return write_rows(folder / IMAGE_DICE_FILE, rows)


def site_means(rows: Iterable[ImageRow]) -> Mapping[str, float]:
    """Mean Dice over each site's images with foreground: the per-site value a run reports."""
    kept: dict[str, list[float]] = {}
    for site, _, foreground, dice in rows:
        if foreground:
            kept.setdefault(site, []).append(dice)
    return {site: float(np.mean(values)) for site, values in kept.items()}
