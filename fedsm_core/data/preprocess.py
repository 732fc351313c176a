"""Shared preprocessing of real images: resizing, per-image normalization, splits.

Every real source ends in the same arrays as the generated datasets
(:class:`~fedsm_core.data.arrays.SegArrays`): float32 ``[N, 3, S, S]`` images
in ``[0, 1]`` and binary float32 ``[N, K, S, S]`` masks. Grey images (MR
slices) repeat their grey value in the three channels, so one model shape
serves every dataset and federation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from PIL import Image

from fedsm_core.data.arrays import SegArrays

# Per-image intensity window: robust to a few hot pixels in MR and to the
# black border of fundus photographs.
LOW_PERCENTILE = 0.5
HIGH_PERCENTILE = 99.5
# Model input of the generated datasets (8-bit values / 255): what a dataset, a bundle
# or a model file that names no preprocessing assumes.
DEFAULT_PREPROCESSING = "unit"


def resize_image(image: np.ndarray, size: int) -> np.ndarray:
    """Resize ``[H, W]`` or ``[H, W, C]`` image data to ``size x size`` float32 (see :func:`resize_to`)."""
    return resize_to(image, size, size)


def resize_to(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize ``[H, W]`` or ``[H, W, C]`` image data to ``height x width`` float32.

    Area averaging (PIL's box filter) when shrinking both sides, so fine
    texture does not alias; bilinear otherwise. Values keep their range.
    """
    array = np.asarray(image, dtype=np.float32)
    planes = array[..., None] if array.ndim == 2 else array
    old_height, old_width = planes.shape[:2]
    shrink = height <= old_height and width <= old_width
    method = Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR
    out = np.stack([np.asarray(Image.fromarray(planes[..., c], mode="F").resize((width, height), method))
                    for c in range(planes.shape[2])], axis=-1)
    return out[..., 0] if array.ndim == 2 else out


def resize_mask(targets: np.ndarray, size: int) -> np.ndarray:
    """Resize binary targets ``[K, H, W]`` to ``[K, size, size]`` by nearest neighbour.

    Nearest neighbour keeps the mask binary; interpolating would create
    fractional labels at every boundary.
    """
    planes = [Image.fromarray(np.asarray(t, dtype=np.uint8) * 255, mode="L")
              .resize((size, size), Image.Resampling.NEAREST) for t in targets]
    return np.stack([np.asarray(p) > 127 for p in planes])


def normalize_image(image: np.ndarray) -> np.ndarray:
    """Scale one image to ``[0, 1]`` by its own intensity percentiles.

    The window runs from the :data:`LOW_PERCENTILE` to the
    :data:`HIGH_PERCENTILE` percentile over all channels together, so a
    colour cast survives (it is site information the selector uses) while
    arbitrary MR intensity units and exposure are removed. A constant image
    maps to zeros.
    """
    array = np.asarray(image, dtype=np.float32)
    low, high = (float(v) for v in np.percentile(array, [LOW_PERCENTILE, HIGH_PERCENTILE]))  # keeps float32
    if high <= low:
        return np.zeros_like(array)
    return np.clip((array - low) / (high - low), 0.0, 1.0)


def to_channels_first(image: np.ndarray) -> np.ndarray:
    """``[H, W]`` or ``[H, W, C]`` into ``[3, H, W]`` (grey repeated three times)."""
    if image.ndim == 2:
        return np.repeat(image[None], 3, axis=0)
    if image.shape[2] == 1:
        return np.repeat(image[None, ..., 0], 3, axis=0)
    return np.moveaxis(image[..., :3], -1, 0)


def prepare_example(image: np.ndarray, targets: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Resize and normalize one image and its targets: ``([3, S, S], [K, S, S])`` float32."""
    picture = to_channels_first(normalize_image(resize_image(image, size)))
    return picture.astype(np.float32), resize_mask(targets, size).astype(np.float32)


def stack_examples(examples: Sequence[tuple[np.ndarray, np.ndarray]], ids: Sequence[str],
                   num_structures: int, size: int,
                   spacings: Mapping[str, tuple[float, float, float]] | None = None) -> SegArrays:
    """SegArrays from prepared examples (an empty split keeps the right shapes), with the cases' ``spacings``."""
    if not examples:
        return SegArrays(np.zeros((0, 3, size, size), np.float32),
                         np.zeros((0, num_structures, size, size), np.float32), (), dict(spacings or {}))
    images = np.stack([image for image, _ in examples])
    masks = np.stack([mask for _, mask in examples])
    return SegArrays(images, masks, tuple(ids), dict(spacings or {}))


def split_off(stems: Sequence[str], fraction: float, seed: int, salt: str) -> tuple[list[str], list[str]]:
    """Split ``stems`` into ``(kept, split_off)`` with ``round(fraction * n)`` taken, seeded.

    At least one is taken when ``fraction > 0`` and there are two or more
    stems, so a small site still has a validation image to score on. The draw
    depends only on the sorted stems, ``seed`` and ``salt`` (e.g. the site
    name), never on listing order, so every machine makes the same split.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"split fraction = {fraction} must be in [0, 1)")
    ordered = sorted(stems)
    rng = np.random.default_rng([seed, *salt.encode()])
    count = round(fraction * len(ordered))
    if fraction > 0 and len(ordered) >= 2:
        count = max(1, count)
    chosen = set(rng.permutation(len(ordered))[:count].tolist())
    kept = [s for i, s in enumerate(ordered) if i not in chosen]
    taken = [s for i, s in enumerate(ordered) if i in chosen]
    return kept, taken
