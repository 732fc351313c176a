"""Letterboxing: images of any shape in a square model input, and masks back at full size.

A model trained on ``S x S`` inputs sees every image at that size. Squashing a
non-square image to a square would change the shapes it was trained on (a round
optic disc becomes an ellipse), so :func:`letterbox_image` keeps the aspect
ratio instead: the image is resized so that its longer side is ``S``, and the
shorter side is padded symmetrically with 0 (black, like the border of a fundus
photograph or the air around an MR slice) after normalization.

:func:`restore_probabilities` undoes it on the model's output: it crops the
padding off the probabilities and resizes them bilinearly to the input's size,
so a mask thresholded there has smooth edges at the input's resolution instead
of the ``H/S x W/S`` blocks of an enlarged label map.

:func:`stretch_for` is the other placement: the whole square, aspect ratio not
kept. It is how the NIfTI loader prepares every training slice (``prepare_example``
resizes a slice to ``S x S``), so slices of a volume are segmented that way.
:func:`model_input` normalizes with the model file's ``preprocessing``
(:data:`NORMALIZERS`) and returns the model's ``[3, S, S]`` input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from fedsm_core.data.preprocess import normalize_image, resize_to, to_channels_first


@dataclasses.dataclass(frozen=True)
class Letterbox:
    """Where an ``height x width`` image lies inside the ``size x size`` model input.

    Attributes
    ----------
    height, width : int
        The input image's size in pixels.
    size : int
        The model's square input size ``S``.
    top, left : int
        Offset of the resized image inside the square.
    inner_height, inner_width : int
        The resized image's size; the longer one equals ``size``.
    """

    height: int
    width: int
    size: int
    top: int
    left: int
    inner_height: int
    inner_width: int


def letterbox_for(height: int, width: int, size: int) -> Letterbox:
    """The letterbox of an ``height x width`` image in an ``size x size`` square."""
    if min(height, width, size) < 1:
        raise ValueError(f"image {width} x {height} or model size {size} is empty; every side must be >= 1 pixel")
    scale = size / max(height, width)
    inner_height = min(size, max(1, round(height * scale)))
    inner_width = min(size, max(1, round(width * scale)))
    return Letterbox(height, width, size, (size - inner_height) // 2, (size - inner_width) // 2,
                     inner_height, inner_width)


def stretch_for(height: int, width: int, size: int) -> Letterbox:
    """The whole ``size x size`` square for an ``height x width`` image (aspect ratio not kept).

    This is the training loader's placement of a NIfTI slice
    (``fedsm_core.data.preprocess.prepare_example`` resizes it to ``size x size``).
    """
    if min(height, width, size) < 1:
        raise ValueError(f"slice {width} x {height} or model size {size} is empty; every side must be >= 1 pixel")
    return Letterbox(height, width, size, 0, 0, size, size)


def letterbox_image(image: np.ndarray, box: Letterbox,
                    normalize: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``[H, W]`` or ``[H, W, C]`` image data into a ``[size, size(, C)]`` float32 square.

    Parameters
    ----------
    image : ndarray
        The image at its own size ``box.height x box.width``.
    box : Letterbox
        From :func:`letterbox_for` for this image.
    normalize : callable
        Maps the resized image (before padding, so the padding does not shift
        percentiles) to the model's value range; the padding is 0 after it.
    """
    if tuple(image.shape[:2]) != (box.height, box.width):
        raise ValueError(f"image of shape {tuple(image.shape[:2])} does not fit its letterbox "
                         f"({box.height}, {box.width})")
    inner = np.asarray(normalize(resize_to(image, box.inner_height, box.inner_width)), dtype=np.float32)
    square = np.zeros((box.size, box.size, *inner.shape[2:]), dtype=np.float32)
    square[box.top:box.top + box.inner_height, box.left:box.left + box.inner_width] = inner
    return square


def restore_probabilities(probabilities: torch.Tensor, box: Letterbox) -> torch.Tensor:
    """Model probabilities ``[K, S, S]`` back to the image: ``[K, height, width]``.

    The padding is cropped off and the rest resized bilinearly (PyTorch's
    ``align_corners=False``, pixel centres as in PIL's resize of the input).
    """
    if tuple(probabilities.shape[1:]) != (box.size, box.size):
        raise ValueError(f"probabilities of shape {tuple(probabilities.shape)} do not match the model size "
                         f"{box.size}")
    inner = probabilities[:, box.top:box.top + box.inner_height, box.left:box.left + box.inner_width]
    restored = F.interpolate(inner[None].float(), size=(box.height, box.width), mode="bilinear",
                             align_corners=False)
    return restored[0]


def _unit(image: np.ndarray) -> np.ndarray:
    return np.clip(image / 255.0, 0.0, 1.0)


# A model file's "preprocessing": 8-bit values / 255, or each image's own percentile window.
NORMALIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"percentile": normalize_image, "unit": _unit}


def model_input(image: np.ndarray, box: Letterbox, preprocessing: str) -> np.ndarray:
    """``[H, W]`` or ``[H, W, 3]`` image data into the model's ``float32 [3, S, S]`` input placed by ``box``.

    ``preprocessing`` (a model file's ``extra["preprocessing"]``) names the
    normalizer of :data:`NORMALIZERS`; grey data is repeated in three channels.
    """
    if preprocessing not in NORMALIZERS:
        raise ValueError(f"preprocessing '{preprocessing}' is unknown; expected one of {sorted(NORMALIZERS)}")
    return to_channels_first(letterbox_image(image, box, NORMALIZERS[preprocessing])).astype(np.float32)
