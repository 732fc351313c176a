"""Segment a folder of images with a super-model bundle (``fedsm predict``).

Each image (any size) is resized to the bundle's input size and normalised
as in training, routed by the selector (Algorithm 2, the bundle's gamma
unless another is given) and segmented by the chosen model; the mask is
resized back to the image's size by nearest neighbour and written as one
grey PNG per image. A ``predictions.csv`` lists per image the routed model,
the selector's confidence and its most likely site.

Mask values: structure ``k`` of ``K`` (bundle order, 1-based) is drawn with
grey value ``round(255 * k / K)``, later structures over earlier ones, on a
background of 0. One structure gives 0/255; disc and cup give 0 / 128 / 255.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fedsm_core.algorithms.super_model import GLOBAL_ROUTE, SuperModel
from fedsm_core.bundle import BundleInfo, load_bundle
from fedsm_core.data.files import IMAGE_SUFFIXES, DataError, read_image
from fedsm_core.data.preprocess import normalize_image, resize_image, to_channels_first

CSV_COLUMNS = ("image", "mask", "width", "height", "model", "selector-confidence", "most-likely-site")


def prepare_input(image: np.ndarray, size: int, preprocessing: str) -> np.ndarray:
    """``uint8 [H, W, 3]`` into the model's ``float32 [3, size, size]`` input."""
    resized = resize_image(image, size)
    if preprocessing == "percentile":
        scaled = normalize_image(resized)
    elif preprocessing == "unit":
        scaled = np.clip(resized / 255.0, 0.0, 1.0)
    else:
        raise ValueError(f"bundle preprocessing '{preprocessing}' is unknown; expected 'unit' or 'percentile'")
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


@torch.no_grad()
def _segment(model: SuperModel, info: BundleInfo, batch: list[tuple[Path, np.ndarray]],
             device: torch.device) -> list[dict]:
    preprocessing = str(info.extra.get("preprocessing", "unit"))
    inputs = torch.from_numpy(np.stack([prepare_input(img, info.image_size, preprocessing) for _, img in batch]))
    logits, routes, probs = model.forward_with_routes(inputs.to(device))
    masks = (torch.sigmoid(logits) > 0.5).cpu().numpy()
    sites = info.site_names if not model.selector_includes_global else ("global", *info.site_names)
    rows = []
    for (path, image), mask, route, p in zip(batch, masks, routes.tolist(), probs.cpu(), strict=True):
        height, width = image.shape[:2]
        rows.append({"path": path, "mask": encode_mask(restore_size(mask, width, height)), "width": width,
                     "height": height, "model": "global" if route == GLOBAL_ROUTE else info.site_names[route],
                     "selector-confidence": f"{float(p.max()):.4f}", "most-likely-site": sites[int(p.argmax())]})
    return rows


def predict_folder(bundle: Path, images: Path, out: Path, gamma: float | None = None,
                   device: torch.device | str = "cpu", batch_size: int = 8) -> tuple[Path, list[str]]:
    """Write one mask PNG per image of ``images`` and ``predictions.csv`` into ``out``.

    Returns
    -------
    (Path, list of str)
        The CSV path and one message per image that could not be read (those
        images are listed, not silently dropped; the others are written).
    """
    model, info = load_bundle(bundle, device)
    if gamma is not None:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"--gamma {gamma} must be in [0, 1]")
        model.gamma = float(gamma)
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
            rows += _segment(model, info, batch, torch.device(device))
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
