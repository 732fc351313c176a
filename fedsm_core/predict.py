"""Segment a folder of images with a model file of a run (``fedsm predict``).

The file is a FedSM super-model bundle (``super_model.pt``) or a single model
(``global_model.pt`` of FedAvg, FedProx, SCAFFOLD or HarmoFL, or one of
FedBN's ``site_models/<site>.pt``). Each image (any size) is resized to the
file's input size and normalised as in training, then segmented: by a
bundle's routed model (Algorithm 2, the bundle's gamma unless another is
given), or by the single model. The mask is resized back to the image's size
by nearest neighbour and written as one grey PNG per image. A
``predictions.csv`` lists per image the model that segmented it, the
selector's confidence and its most likely site; a single model has no
selector, so its rows say ``global`` and leave the selector's columns empty.

Mask values: structure ``k`` of ``K`` (file order, 1-based) is drawn with
grey value ``round(255 * k / K)``, later structures over earlier ones, on a
background of 0. One structure gives 0/255; disc and cup give 0 / 128 / 255.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from fedsm_core.algorithms.super_model import GLOBAL_ROUTE, SuperModel
from fedsm_core.bundle import bundle_from_payload
from fedsm_core.data.files import IMAGE_SUFFIXES, DataError, read_image
from fedsm_core.data.preprocess import DEFAULT_PREPROCESSING, normalize_image, resize_image, to_channels_first
from fedsm_core.model_files import BUNDLE_FORMAT, GLOBAL_MODEL_FORMAT, global_model_from_payload, read_model_file

CSV_COLUMNS = ("image", "mask", "width", "height", "model", "selector-confidence", "most-likely-site")
GLOBAL_MODEL_NAME = "global"  # the "model" column of images the global (or single) model segmented

# Logits [B, K, S, S] of a batch and, per image, the values of the last three CSV columns.
Router = Callable[[torch.Tensor], tuple[torch.Tensor, list[dict[str, str]]]]


@dataclasses.dataclass(frozen=True)
class Predictor:
    """A loaded model file: how it segments a batch and what input it expects."""

    route: Router
    image_size: int
    preprocessing: str


def prepare_input(image: np.ndarray, size: int, preprocessing: str) -> np.ndarray:
    """``uint8 [H, W, 3]`` into the model's ``float32 [3, size, size]`` input."""
    resized = resize_image(image, size)
    if preprocessing == "percentile":
        scaled = normalize_image(resized)
    elif preprocessing == "unit":
        scaled = np.clip(resized / 255.0, 0.0, 1.0)
    else:
        raise ValueError(f"preprocessing '{preprocessing}' is unknown; expected 'unit' or 'percentile'")
    return to_channels_first(scaled).astype(np.float32)


def encode_mask(binary: np.ndarray) -> np.ndarray:
    """``bool [K, H, W]`` into a grey ``uint8 [H, W]`` label image (see the module docstring)."""
    count = binary.shape[0]
    out = np.zeros(binary.shape[1:], dtype=np.uint8)
    for k in range(count):
        out[binary[k]] = round(255 * (k + 1) / count)
    return out


def restore_size(binary: np.ndarray, width: int, height: int) -> np.ndarray:
    """Nearest-neighbour resize of ``bool [K, S, S]`` to ``[K, height, width]``."""
    planes = [Image.fromarray(b.astype(np.uint8) * 255).resize((width, height), Image.Resampling.NEAREST)
              for b in binary]
    return np.stack([np.asarray(p) > 127 for p in planes])


def list_input_images(folder: Path) -> list[Path]:
    """Image files of ``folder`` sorted by name; an error when there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"--images {folder} is not a folder")
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
    if not files:
        raise DataError(f"--images {folder} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    stems = [p.stem for p in files]
    clashes = sorted({p.name for p in files if stems.count(p.stem) > 1})
    if clashes:
        raise DataError(f"--images {folder}: {clashes} share a name; their masks would overwrite each other")
    return files


def _route_super_model(model: SuperModel, site_names: Sequence[str],
                       inputs: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, str]]]:
    logits, routes, probs = model.forward_with_routes(inputs)
    sites = site_names if not model.selector_includes_global else (GLOBAL_MODEL_NAME, *site_names)
    columns = [{"model": GLOBAL_MODEL_NAME if route == GLOBAL_ROUTE else site_names[route],
                "selector-confidence": f"{float(p.max()):.4f}", "most-likely-site": sites[int(p.argmax())]}
               for route, p in zip(routes.tolist(), probs.cpu(), strict=True)]
    return logits, columns


def _route_single_model(model: torch.nn.Module, inputs: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, str]]]:
    # No selector ran: the table keeps its columns, with the selector's left empty.
    columns = [{"model": GLOBAL_MODEL_NAME, "selector-confidence": "", "most-likely-site": ""}] * len(inputs)
    return model(inputs), columns


def _super_model_predictor(payload: dict[str, Any], path: Path, gamma: float | None,
                           device: torch.device | str) -> Predictor:
    model, info = bundle_from_payload(payload, path, device)
    if gamma is not None:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"--gamma {gamma} must be in [0, 1]")
        model.gamma = float(gamma)
    preprocessing = str(info.extra.get("preprocessing", DEFAULT_PREPROCESSING))
    return Predictor(functools.partial(_route_super_model, model, info.site_names), info.image_size, preprocessing)


def _global_model_predictor(payload: dict[str, Any], path: Path, gamma: float | None,
                            device: torch.device | str) -> Predictor:
    if gamma is not None:
        raise ValueError(f"--gamma {gamma}: gamma applies to super models only, and '{path}' holds a single "
                         f"model ({GLOBAL_MODEL_FORMAT}) that segments every image; drop --gamma")
    model, info = global_model_from_payload(payload, path, device)
    # Files saved before runs recorded their preprocessing get the default, as bundles do.
    preprocessing = str(info.extra.get("preprocessing", DEFAULT_PREPROCESSING))
    return Predictor(functools.partial(_route_single_model, model), info.image_size, preprocessing)


PREDICTORS: dict[str, Callable[[dict[str, Any], Path, float | None, torch.device | str], Predictor]] = {
    BUNDLE_FORMAT: _super_model_predictor,
    GLOBAL_MODEL_FORMAT: _global_model_predictor,
}


@torch.no_grad()
def _segment(predictor: Predictor, batch: list[tuple[Path, np.ndarray]], device: torch.device) -> list[dict]:
    inputs = np.stack([prepare_input(img, predictor.image_size, predictor.preprocessing) for _, img in batch])
    logits, columns = predictor.route(torch.from_numpy(inputs).to(device))
    masks = (torch.sigmoid(logits) > 0.5).cpu().numpy()
    rows = []
    for (path, image), mask, route in zip(batch, masks, columns, strict=True):
        height, width = image.shape[:2]
        rows.append({"path": path, "mask": encode_mask(restore_size(mask, width, height)), "width": width,
                     "height": height, **route})
    return rows


def predict_folder(model_file: Path, images: Path, out: Path, gamma: float | None = None,
                   device: torch.device | str = "cpu", batch_size: int = 8) -> tuple[Path, list[str]]:
    """Write one mask PNG per image of ``images`` and ``predictions.csv`` into ``out``.

    Parameters
    ----------
    model_file : Path
        A super-model bundle or a single-model file (see the module docstring).
    gamma : float or None
        A bundle's selector threshold instead of its own; an error with a
        single model, which has no selector.

    Returns
    -------
    (Path, list of str)
        The CSV path and one message per image that could not be read (those
        images are listed, not silently dropped; the others are written).
    """
    payload = read_model_file(model_file, tuple(PREDICTORS), "FedSM bundle or global model")
    predictor = PREDICTORS[payload["format"]](payload, Path(model_file), gamma, device)
    files = list_input_images(images)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
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
            rows += _segment(predictor, batch, torch.device(device))
    return _write_outputs(rows, out), failures


def _write_outputs(rows: list[dict], out: Path) -> Path:
    table = out / "predictions.csv"
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            mask_path = out / f"{row['path'].stem}.png"
            Image.fromarray(row["mask"]).save(mask_path)
            writer.writerow({**{k: row[k] for k in CSV_COLUMNS[2:]}, "image": row["path"].name, "mask": mask_path.name})
    return table
