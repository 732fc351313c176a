"""Segment a folder of NIfTI volumes slice by slice (``fedsm predict`` on ``.nii`` / ``.nii.gz``).

Each volume is cut along its third voxel axis into axial slices, as the NIfTI
loader cuts training volumes (:mod:`fedsm_core.data.nifti_volumes`: rows = first
voxel axis, columns = second, no reorientation). A slice is prepared as in
training, by ``prepare_example``: resized to the model's ``S x S`` input
(aspect ratio *not* kept, :func:`fedsm_core.inference.letterbox.stretch_for`)
and normalised with the model file's preprocessing (the NIfTI sources record
``percentile``). The model's probabilities are resized bilinearly back to the
slice's own size and thresholded at 0.5 there (the inverse mapping of
:func:`fedsm_core.inference.letterbox.restore_probabilities`). A volume is one
case: a super model whose ``route-by`` (the bundle's, or ``--route-by``) is
``"image"`` routes every slice on its own (the predictor's router, as for 2-D
images); with ``"case"`` it routes the volume once, from all its slices
(``Predictor.route_case``: the mean selector log-probability over the slices,
then gamma, as evaluation routes a case), and every slice goes to that model.

Labels: structure ``k`` of the model (1-based, file order) is label ``k``,
later structures over earlier ones, background 0; a prostate model gives
1 = prostate. The mask volume keeps the input's voxel grid, affine and header
(:func:`fedsm_core.inference.volume_files.write_label_volume`).

``predictions.csv`` has one row per volume (:data:`VOLUME_CSV_COLUMNS`):
``shape`` is the input's (``x`` by ``y`` by ``z`` [by modality]); ``slices`` the
number segmented; ``model`` the route most slices took (ties: the earliest
slice's); ``routes`` every route with its share of the slices, most frequent
first (``global=0.6667;site-a=0.3333``; routed per case, the one route
``site-a=1.0000``); ``selector-confidence`` the mean over slices and
``most-likely-site`` the most frequent (per case: the case's own; both empty
for a single model, which has no selector).
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedsm_core.data.files import DataError
from fedsm_core.data.nifti_cases import read_image
from fedsm_core.inference.letterbox import model_input, restore_probabilities, stretch_for
from fedsm_core.inference.predict_output import TABLE_NAME, prepare_output_folder
from fedsm_core.inference.volume_files import (
    VolumeInput,
    check_modality,
    list_input_volumes,
    mask_volume_name,
    read_volume_input,
    write_label_volume,
)

if TYPE_CHECKING:  # predict.py imports this module; the predictor is only a type here
    from fedsm_core.inference.predict import Predictor

VOLUME_CSV_COLUMNS = ("image", "mask", "shape", "slices", "model", "routes", "selector-confidence",
                      "most-likely-site")


def prepare_slice(image: np.ndarray, size: int, preprocessing: str) -> np.ndarray:
    """A ``[H, W]`` slice into the model's ``float32 [3, size, size]`` input, as training prepared slices."""
    return model_input(image, stretch_for(image.shape[0], image.shape[1], size), preprocessing)


def label_map(binary: np.ndarray) -> np.ndarray:
    """``bool [K, H, W]`` into ``uint8 [H, W]`` labels: structure ``k`` (0-based) is ``k + 1``, later over earlier."""
    if binary.shape[0] > 255:
        raise ValueError(f"{binary.shape[0]} structures do not fit uint8 labels; at most 255")
    labels = np.zeros(binary.shape[1:], dtype=np.uint8)
    for k in range(binary.shape[0]):
        labels[binary[k]] = k + 1
    return labels


def slice_batches(predictor: Predictor, volume: np.ndarray, device: torch.device,
                  batch_size: int) -> Iterator[tuple[range, torch.Tensor]]:
    """Slice indices and ``[B, 3, S, S]`` model inputs of a ``[X, Y, Z]`` volume, ``batch_size`` slices at a time."""
    height, width, depth = volume.shape
    box = stretch_for(height, width, predictor.image_size)
    for start in range(0, depth, batch_size):
        indices = range(start, min(depth, start + batch_size))
        inputs = np.stack([model_input(volume[:, :, z], box, predictor.preprocessing) for z in indices])
        yield indices, torch.from_numpy(inputs).to(device)


@torch.no_grad()
def segment_volume(predictor: Predictor, volume: np.ndarray, device: torch.device,
                   batch_size: int) -> tuple[np.ndarray, int, list[dict[str, str]]]:
    """Labels of a ``float32 [X, Y, Z]`` volume, slice by slice along Z.

    With ``predictor.route_case`` (``route-by = "case"``) the selector first
    sees every slice and chooses one model for the volume; the slices are
    prepared again, batch by batch, for that model.

    Returns
    -------
    (ndarray, int, list of dict)
        ``uint8 [X, Y, Z]`` labels (see :func:`label_map`), the model's number
        of structures ``K``, and per slice the router's columns (``model``,
        ``selector-confidence``, ``most-likely-site``).
    """
    box = stretch_for(volume.shape[0], volume.shape[1], predictor.image_size)
    labels = np.zeros(volume.shape, dtype=np.uint8)
    columns: list[dict[str, str]] = []
    num_structures = 0
    route = predictor.route
    if predictor.route_case is not None:
        route = predictor.route_case(inputs for _, inputs in slice_batches(predictor, volume, device, batch_size))
    for indices, inputs in slice_batches(predictor, volume, device, batch_size):
        logits, batch_columns = route(inputs)
        probabilities = torch.sigmoid(logits.float()).cpu()
        num_structures = probabilities.shape[1]
        for z, probs in zip(indices, probabilities, strict=True):
            labels[:, :, z] = label_map((restore_probabilities(probs, box) > 0.5).numpy())
        columns += batch_columns
    return labels, num_structures, columns


def summarize_routes(columns: Sequence[dict[str, str]]) -> dict[str, str]:
    """A volume's route columns from its slices' (see the module docstring)."""
    if not columns:
        raise ValueError("a volume without slices has no routes")
    routes = Counter(column["model"] for column in columns)
    sites = Counter(column["most-likely-site"] for column in columns)
    confidences = [float(column["selector-confidence"]) for column in columns if column["selector-confidence"]]
    return {
        "model": routes.most_common(1)[0][0],
        "routes": ";".join(f"{route}={count / len(columns):.4f}" for route, count in routes.most_common()),
        "selector-confidence": f"{np.mean(confidences):.4f}" if confidences else "",
        "most-likely-site": sites.most_common(1)[0][0],
    }


def _read_headers(files: Sequence[Path], failures: list[str]) -> list[VolumeInput]:
    volumes = []
    for path in files:
        try:
            volumes.append(read_volume_input(path))
        except DataError as error:
            failures.append(str(error))
    return volumes


def _predict_one(predictor: Predictor, volume: VolumeInput, out: Path, modality: int | None,
                 device: torch.device, batch_size: int) -> dict[str, str | int]:
    """Segment one volume, write its mask volume into ``out``; its table row."""
    data = read_image(volume.path, 0 if modality is None else modality)
    labels, num_structures, columns = segment_volume(predictor, data, device, batch_size)
    name = mask_volume_name(volume.path)
    write_label_volume(labels, volume, predictor.structures, out / name, num_structures)
    return {"image": volume.path.name, "mask": name, "shape": "x".join(str(n) for n in volume.shape),
            "slices": labels.shape[2], **summarize_routes(columns)}


def predict_volume_folder(predictor: Predictor, images: Path, out: Path, modality: int | None,
                          device: torch.device, batch_size: int, overwrite: bool) -> tuple[Path, list[str]]:
    """Write one mask volume per volume of ``images`` and ``predictions.csv`` into ``out``.

    Parameters
    ----------
    predictor : Predictor
        The loaded model file (``fedsm_core.inference.predict``).
    modality : int or None
        Channel of 4-D volumes; required when there is one (see
        :func:`fedsm_core.inference.volume_files.check_modality`).
    overwrite : bool
        Replace an earlier run's results in ``out``
        (:func:`fedsm_core.inference.predict_output.prepare_output_folder`).

    Returns
    -------
    (Path, list of str)
        The CSV path and one message per volume that could not be read; the
        others are written. Each row is written as soon as its mask is, so a
        stopped run leaves a table of what it wrote (``--overwrite`` clears it).
    """
    images, out = Path(images), Path(out)
    files = list_input_volumes(images)
    failures: list[str] = []
    volumes = _read_headers(files, failures)
    check_modality(volumes, modality, images)
    prepare_output_folder(images, out, [mask_volume_name(path) for path in files], overwrite)
    table = out / TABLE_NAME
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=VOLUME_CSV_COLUMNS)
        writer.writeheader()
        for volume in volumes:
            try:
                writer.writerow(_predict_one(predictor, volume, out, modality, device, batch_size))
            except DataError as error:
                failures.append(str(error))
            handle.flush()
    return table, failures
