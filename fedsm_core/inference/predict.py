"""Segment a folder of images with a model file of a run (``fedsm predict``).

The file is a FedSM super-model bundle (``super_model.pt``) or a single model
(``global_model.pt`` of FedAvg, FedProx, SCAFFOLD or HarmoFL, or one of
FedBN's ``site_models/<site>.pt``). Each image (any size) is resized to the
file's input size with its aspect ratio kept (longer side to the model's
size, the shorter padded: see :mod:`fedsm_core.inference.letterbox`) and normalised as
in training, then segmented: by a bundle's routed model (Algorithm 2, the
bundle's gamma unless another is given), or by the single model. The model's
probabilities are cropped to the image, resized bilinearly to the image's own
size and thresholded at 0.5 there, and written as one grey PNG per image. A
``predictions.csv`` lists per image the model that segmented it, the
selector's confidence and its most likely site; a single model has no
selector, so its rows say ``global`` and leave the selector's columns empty.
The output folder is checked first (:mod:`fedsm_core.inference.predict_output`): input
images and earlier results are never overwritten unasked.

Mask values: structure ``k`` of ``K`` (file order, 1-based) is drawn with
grey value ``round(255 * k / K)``, later structures over earlier ones, on a
background of 0. One structure gives 0/255; disc and cup give 0 / 128 / 255.

A folder of NIfTI volumes (``.nii``, ``.nii.gz``) is segmented slice by slice
into one label volume per input (:mod:`fedsm_core.inference.predict_volumes`);
a folder holding both 2-D images and volumes is refused.

Routing follows the bundle's ``route-by`` (``--route-by`` overrides it): a
volume is one case, so with ``"case"`` its slices are routed once, together
(:func:`fedsm_core.algorithms.fedsm.super_model.selector_probabilities`, the
rule evaluation uses). 2-D images carry no case and are always routed one by
one: ``--route-by case`` is refused for them, and a bundle of a ``"case"`` run
routes them alone with a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsm_core.algorithms.fedsm.super_model import GLOBAL_ROUTE, SuperModel, selector_probabilities
from fedsm_core.data.files import IMAGE_SUFFIXES, DataError, read_image
from fedsm_core.data.preprocess import DEFAULT_PREPROCESSING
from fedsm_core.inference.letterbox import letterbox_for, model_input, restore_probabilities
from fedsm_core.inference.predict_output import CSV_COLUMNS, mask_name, prepare_output_folder, write_outputs
from fedsm_core.inference.predict_volumes import predict_volume_folder
from fedsm_core.inference.volume_files import input_kind
from fedsm_core.run_files.bundle import bundle_from_payload, check_route_by
from fedsm_core.run_files.model_files import (
    BUNDLE_FORMAT,
    GLOBAL_MODEL_FORMAT,
    global_model_from_payload,
    read_model_file,
)

__all__ = ["CSV_COLUMNS", "Predictor", "encode_mask", "list_input_images", "predict_folder", "prepare_input",
           "segment_batch"]
GLOBAL_MODEL_NAME = "global"  # the "model" column of images the global (or single) model segmented

# Logits [B, K, S, S] of a batch and, per image, the values of the last three CSV columns.
Router = Callable[[torch.Tensor], tuple[torch.Tensor, list[dict[str, str]]]]
# Given the input batches of every slice of one case (a volume), the router of that case's slices.
CaseRouter = Callable[[Iterable[torch.Tensor]], Router]
VOLUME_CASE = "volume"  # the one case of the slices a CaseRouter routes together


@dataclasses.dataclass(frozen=True)
class Predictor:
    """A loaded model file: how it segments a batch, what input it expects and what it draws.

    ``structures`` are the names of the model's output channels, in order
    (label ``k`` of a mask volume is structure ``k``, 1-based).
    ``route_case`` is set when a super model routes once per case
    (``route-by = "case"``): volumes use it instead of ``route``.
    """

    route: Router
    image_size: int
    preprocessing: str
    structures: tuple[str, ...] = ()
    route_case: CaseRouter | None = None


def prepare_input(image: np.ndarray, size: int, preprocessing: str) -> np.ndarray:
    """``uint8 [H, W, 3]`` into the model's ``float32 [3, size, size]`` input, aspect ratio kept.

    The image is resized so that its longer side is ``size``, normalised
    (``preprocessing``: ``unit`` divides by 255, ``percentile`` stretches the
    image's own percentiles) and padded with 0 to a square
    (:func:`fedsm_core.inference.letterbox.letterbox_image`).
    """
    return model_input(image, letterbox_for(image.shape[0], image.shape[1], size), preprocessing)


def encode_mask(binary: np.ndarray) -> np.ndarray:
    """``bool [K, H, W]`` into a grey ``uint8 [H, W]`` label image (see the module docstring)."""
    count = binary.shape[0]
    out = np.zeros(binary.shape[1:], dtype=np.uint8)
    for k in range(count):
        out[binary[k]] = round(255 * (k + 1) / count)
    return out


def list_input_images(folder: Path) -> list[Path]:
    """Image files of ``folder`` sorted by name; an error when there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"--images {folder} is not a folder")
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
    if not files:
        raise DataError(f"--images {folder} holds no image files ({', '.join(IMAGE_SUFFIXES)}) "
                        "and no NIfTI volumes (.nii, .nii.gz)")
    stems = [p.stem for p in files]
    clashes = sorted({p.name for p in files if stems.count(p.stem) > 1})
    if clashes:
        raise DataError(f"--images {folder}: {clashes} share a name; their masks would overwrite each other")
    return files


def _route_columns(model: SuperModel, site_names: Sequence[str], routes: torch.Tensor,
                   probs: torch.Tensor) -> list[dict[str, str]]:
    """Per row: the model that segments it, the selector's confidence and its most likely site."""
    sites = site_names if not model.selector_includes_global else (GLOBAL_MODEL_NAME, *site_names)
    return [{"model": GLOBAL_MODEL_NAME if route == GLOBAL_ROUTE else site_names[route],
             "selector-confidence": f"{float(p.max()):.4f}", "most-likely-site": sites[int(p.argmax())]}
            for route, p in zip(routes.tolist(), probs.cpu(), strict=True)]


def _route_super_model(model: SuperModel, site_names: Sequence[str],
                       inputs: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, str]]]:
    logits, routes, probs = model.forward_with_routes(inputs)
    return logits, _route_columns(model, site_names, routes, probs)


@torch.no_grad()
def _route_case(model: SuperModel, site_names: Sequence[str], batches: Iterable[torch.Tensor]) -> Router:
    """Route one case once (``route-by = "case"``): the router that sends each of its slices to that one model.

    The selector runs on every slice (``batches``: ``[B, 3, S, S]`` inputs);
    :func:`~fedsm_core.algorithms.fedsm.super_model.selector_probabilities`
    gives every slice the case's ``softmax`` of the mean log-probability, and
    ``SuperModel.routes`` applies gamma (or FedSM-extra's argmax) to it, as in
    evaluation. Every slice's row then reports that route and probability.
    """
    logits = torch.cat([model.selector(inputs) for inputs in batches])
    probs = selector_probabilities(logits, [VOLUME_CASE] * len(logits), "case")
    routes = model.routes(probs)
    route, column = int(routes[0]), _route_columns(model, site_names, routes[:1], probs[:1])[0]
    chosen = model.global_model if route == GLOBAL_ROUTE else model.personalized[route]
    return functools.partial(_route_single_model, chosen, column=column)


def _route_single_model(model: torch.nn.Module, inputs: torch.Tensor,
                        column: dict[str, str] | None = None) -> tuple[torch.Tensor, list[dict[str, str]]]:
    # ``column``: every row's columns; by default (no selector ran) ``global`` with the selector's left empty.
    if column is None:
        column = {"model": GLOBAL_MODEL_NAME, "selector-confidence": "", "most-likely-site": ""}
    return model(inputs), [column] * len(inputs)


def _super_model_predictor(payload: dict[str, Any], path: Path, gamma: float | None, route_by: str | None,
                           device: torch.device | str) -> Predictor:
    """A bundle's predictor; ``gamma`` and ``route_by`` (None: the bundle's) as ``--gamma`` and ``--route-by``."""
    model, info = bundle_from_payload(payload, path, device)
    if gamma is not None:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"--gamma {gamma} must be in [0, 1]")
        model.gamma = float(gamma)
    if route_by is None:
        route_by = info.route_by
    check_route_by(route_by, "--route-by", "pass --route-by image or --route-by case")
    route_case = functools.partial(_route_case, model, info.site_names) if route_by == "case" else None
    preprocessing = str(info.extra.get("preprocessing", DEFAULT_PREPROCESSING))
    return Predictor(functools.partial(_route_super_model, model, info.site_names), info.image_size, preprocessing,
                     tuple(info.structures), route_case)


def _global_model_predictor(payload: dict[str, Any], path: Path, gamma: float | None, route_by: str | None,
                            device: torch.device | str) -> Predictor:
    for option, value in (("--gamma", gamma), ("--route-by", route_by)):
        if value is not None:
            raise ValueError(f"{option} {value}: {option[2:]} applies to super models only, and '{path}' holds a "
                             f"single model ({GLOBAL_MODEL_FORMAT}) that segments every image; drop {option}")
    model, info = global_model_from_payload(payload, path, device)
    # Files saved before runs recorded their preprocessing get the default, as bundles do.
    preprocessing = str(info.extra.get("preprocessing", DEFAULT_PREPROCESSING))
    return Predictor(functools.partial(_route_single_model, model), info.image_size, preprocessing,
                     tuple(info.structures))


PREDICTORS: dict[str, Callable[[dict[str, Any], Path, float | None, str | None, torch.device | str], Predictor]] = {
    BUNDLE_FORMAT: _super_model_predictor,
    GLOBAL_MODEL_FORMAT: _global_model_predictor,
}


def check_images_routing(predictor: Predictor, route_by: str | None, model_file: Path, images: Path) -> None:
    """2-D images carry no case, so each is routed alone: ``--route-by case`` is refused for them.

    A bundle of a ``route-by = "case"`` run (no ``--route-by``) routes them
    alone too, with a warning, as evaluation routes images without a case.
    """
    if predictor.route_case is None:
        return
    if route_by == "case":
        raise ValueError(f"--route-by case routes once per case (a NIfTI volume), but --images {images} holds 2-D "
                         "images, which carry no case; drop --route-by case (or pass --route-by image) to route "
                         "each image alone, or pass the case's volume (.nii, .nii.gz) to route it once")
    warnings.warn(f"'{model_file}' was trained with route-by = \"case\", but the 2-D images of --images {images} "
                  "carry no case: each image is routed alone; pass --route-by image to say so", stacklevel=3)


@torch.no_grad()
def segment_batch(predictor: Predictor, batch: list[tuple[Path, np.ndarray]], device: torch.device) -> list[dict]:
    """Masks of a batch of ``(path, uint8 [H, W, 3])`` at each image's own size, with the route columns."""
    inputs = np.stack([prepare_input(img, predictor.image_size, predictor.preprocessing) for _, img in batch])
    logits, columns = predictor.route(torch.from_numpy(inputs).to(device))
    probabilities = torch.sigmoid(logits.float()).cpu()
    rows = []
    for (path, image), probs, route in zip(batch, probabilities, columns, strict=True):
        height, width = image.shape[:2]
        box = letterbox_for(height, width, predictor.image_size)
        binary = (restore_probabilities(probs, box) > 0.5).numpy()
        rows.append({"path": path, "mask": encode_mask(binary), "width": width, "height": height, **route})
    return rows


def predict_folder(model_file: Path, images: Path, out: Path, gamma: float | None = None,
                   device: torch.device | str = "cpu", batch_size: int = 8,
                   overwrite: bool = False, modality: int | None = None,
                   route_by: str | None = None) -> tuple[Path, list[str]]:
    """Write one mask PNG per image of ``images`` and ``predictions.csv`` into ``out``.

    A folder of NIfTI volumes gets one mask volume per volume instead
    (:func:`fedsm_core.inference.predict_volumes.predict_volume_folder`); a
    folder holding both kinds is refused.

    Parameters
    ----------
    model_file : Path
        A super-model bundle or a single-model file (see the module docstring).
    gamma : float or None
        A bundle's selector threshold instead of its own; an error with a
        single model, which has no selector.
    batch_size : int
        Images per forward pass, at least 1.
    overwrite : bool
        Replace the results of an earlier run in ``out`` (see
        :func:`fedsm_core.inference.predict_output.prepare_output_folder`).
    modality : int or None
        Channel of 4-D volumes (required when there is one); an error for 2-D images.
    route_by : {"image", "case"} or None
        A bundle's routing instead of its own ``route-by``: ``"case"`` routes
        each volume once; an error for 2-D images (no case) and for a single model.

    Returns
    -------
    (Path, list of str)
        The CSV path and one message per image that could not be read (those
        images are listed, not silently dropped; the others are written).
    """
    if batch_size < 1:
        raise ValueError(f"--batch-size {batch_size} must be at least 1")
    payload = read_model_file(model_file, tuple(PREDICTORS), "FedSM bundle or global model")
    predictor = PREDICTORS[payload["format"]](payload, Path(model_file), gamma, route_by, device)
    if input_kind(images) == "volumes":
        return predict_volume_folder(predictor, images, out, modality, torch.device(device), batch_size, overwrite)
    if modality is not None:
        raise ValueError(f"--modality {modality} applies to NIfTI volumes only, and --images {images} holds 2-D "
                         "images; drop --modality")
    check_images_routing(predictor, route_by, model_file, images)
    files = list_input_images(images)
    out = Path(out)
    prepare_output_folder(Path(images), out, [mask_name(path) for path in files], overwrite)
    failures: list[str] = []
    rows: list[dict] = []
    for start in range(0, len(files), batch_size):
        batch = []
        for path in files[start:start + batch_size]:
            try:
                batch.append((path, read_image(path, "RGB")))
            except DataError as error:
                failures.append(str(error))
        if batch:
            rows += segment_batch(predictor, batch, torch.device(device))
    return write_outputs(rows, out), failures
