"""Tiny PNG sites in the public layouts, written with PIL for the data tests.

Every example of a site is 16x16 with its structure at a known square, one
square per stem (``BOXES``), aligned to even pixels so that shrinking to 8x8
with nearest neighbour maps it to exactly half the coordinates. The image is
bright (200) inside the outer structure and dark (50) elsewhere, so after
per-image normalization channel 0 equals the outer target: a mask paired with
the wrong image shows up.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

FILE_SIZE = 16

# stem -> (row0, row1, col0, col1) of the outer structure (disc / prostate), in file pixels
BOXES = {
    "a": (2, 10, 2, 10),
    "b": (4, 12, 4, 12),
    "c": (6, 14, 6, 14),
    "d": (2, 10, 6, 14),
    "e": (6, 14, 2, 10),
    "f": (4, 12, 2, 10),
    "t1": (2, 10, 4, 12),
    "t2": (8, 16, 8, 16),
    "x1": (0, 8, 0, 8),
    "x2": (8, 16, 0, 8),
    "x3": (0, 8, 8, 16),
}


def box_target(stem: str, size: int, inner: bool = False) -> np.ndarray:
    """The expected binary target of ``stem`` at ``size`` (outer square, or the cup inside it)."""
    r0, r1, c0, c1 = BOXES[stem]
    if inner:  # the cup: the middle 4x4 of the 8x8 disc
        r0, r1, c0, c1 = r0 + 2, r1 - 2, c0 + 2, c1 - 2
    factor = FILE_SIZE // size
    target = np.zeros((size, size), np.float32)
    target[r0 // factor: r1 // factor, c0 // factor: c1 // factor] = 1.0
    return target


def _image(stem: str, channels: int) -> np.ndarray:
    r0, r1, c0, c1 = BOXES[stem]
    grey = np.full((FILE_SIZE, FILE_SIZE), 50, np.uint8)
    grey[r0:r1, c0:c1] = 200
    if channels == 1:
        return grey
    rgb = np.stack([grey, np.full_like(grey, 50), np.full_like(grey, 50)], axis=-1)
    return rgb


def fundus_mask(stem: str) -> np.ndarray:
    """DoFE values: 255 background, 128 disc rim, 0 cup (middle of the disc)."""
    r0, r1, c0, c1 = BOXES[stem]
    mask = np.full((FILE_SIZE, FILE_SIZE), 255, np.uint8)
    mask[r0:r1, c0:c1] = 128
    mask[r0 + 2: r1 - 2, c0 + 2: c1 - 2] = 0
    return mask


def prostate_mask(stem: str) -> np.ndarray:
    """Inverted binary: 0 prostate, 255 background."""
    r0, r1, c0, c1 = BOXES[stem]
    mask = np.full((FILE_SIZE, FILE_SIZE), 255, np.uint8)
    mask[r0:r1, c0:c1] = 0
    return mask


def save(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def fundus_folders(site: Path, split: str) -> tuple[Path, Path]:
    return site / split / "ROIs" / "image", site / split / "ROIs" / "mask"


def prostate_folders(site: Path, split: str) -> tuple[Path, Path]:
    return site / split / "image", site / split / "mask"


def write_fundus_site(site: Path, train=("a", "b", "c", "d", "e"), test=("t1", "t2"),
                      rgb_masks: bool = False) -> Path:
    """A ``fundus-dofe`` site: RGB images, grey (or grey RGB) masks 0/128/255."""
    for split, stems in (("train", train), ("test", test)):
        image_dir, mask_dir = fundus_folders(site, split)
        image_dir.mkdir(parents=True, exist_ok=True)
        mask_dir.mkdir(parents=True, exist_ok=True)
        for stem in stems:
            save(image_dir / f"{stem}.png", _image(stem, 3))
            mask = fundus_mask(stem)
            save(mask_dir / f"{stem}.png", np.stack([mask] * 3, axis=-1) if rgb_masks else mask)
    return site


def write_prostate_site(site: Path, train=("a", "b", "c", "d", "e"), test=("t1", "t2")) -> Path:
    """A ``prostate-slices`` site: grey images, masks 0 = prostate, 255 = background."""
    for split, stems in (("train", train), ("test", test)):
        image_dir, mask_dir = prostate_folders(site, split)
        image_dir.mkdir(parents=True, exist_ok=True)
        mask_dir.mkdir(parents=True, exist_ok=True)
        for stem in stems:
            save(image_dir / f"{stem}.png", _image(stem, 1))
            save(mask_dir / f"{stem}.png", prostate_mask(stem))
    return site


def write_slice_site(folder: Path, seed: int) -> None:
    """A tiny ProstateSlice-layout site: grey images with a dark gland, inverted masks."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", 4), ("test", 2)):
        for sub in ("image", "mask"):
            (folder / split / sub).mkdir(parents=True)
        for i in range(count):
            y, x = np.mgrid[:40, :40]
            gland = (y - 20 - rng.integers(-4, 5)) ** 2 + (x - 20 - rng.integers(-4, 5)) ** 2 < 64
            image = np.where(gland, 60, 170) + rng.integers(0, 30, (40, 40))
            Image.fromarray(image.astype(np.uint8)).save(folder / split / "image" / f"s{i:02d}.png")
            Image.fromarray(np.where(gland, 0, 255).astype(np.uint8)).save(folder / split / "mask" / f"s{i:02d}.png")
