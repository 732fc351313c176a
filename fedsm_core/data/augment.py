"""Training augmentation with albumentations, applied identically to image and mask.

Three policies, chosen by the run-config key ``augmentation``:

* ``"none"``: the batch as stored;
* ``"flip"``: horizontal and vertical flips (the default; cheap, exact);
* ``"affine"``: flips, a small affine warp (scale 0.9-1.1, shift up to 6 %,
  rotation up to 15 degrees) and brightness/contrast jitter of 10 %: the
  usual recipe for real multi-site images, where acquisition varies more
  than in the generated data.

Masks are warped with nearest-neighbour interpolation so they stay binary,
and photometric changes touch the image only. albumentations is used for the
warps rather than hand-written code: its geometric transforms keep image and
mask in register by construction and are well tested.
"""

from __future__ import annotations

import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # never look for updates on import

import albumentations as A  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402

AUGMENTATIONS = ("none", "flip", "affine")


def build_augmentation(policy: str, seed: int) -> A.Compose | None:
    """The albumentations pipeline of ``policy`` (``None`` for ``"none"``), seeded."""
    if policy not in AUGMENTATIONS:
        raise ValueError(f"augmentation = '{policy}' must be one of {AUGMENTATIONS}")
    if policy == "none":
        return None
    steps: list = [A.HorizontalFlip(p=0.5), A.VerticalFlip(p=0.5)]
    if policy == "affine":
        steps += [
            A.Affine(scale=(0.9, 1.1), translate_percent=(-0.06, 0.06), rotate=(-15, 15),
                     interpolation=cv2.INTER_LINEAR, mask_interpolation=cv2.INTER_NEAREST,
                     border_mode=cv2.BORDER_REFLECT_101, p=0.8),
            A.RandomBrightnessContrast(brightness_limit=0.1, contrast_limit=0.1, p=0.8),
        ]
    return A.Compose(steps, seed=seed)


def augment_pairs(images: np.ndarray, masks: np.ndarray, pipeline: A.Compose) -> tuple[np.ndarray, np.ndarray]:
    """Apply ``pipeline`` to each ``[C, H, W]`` image and ``[K, H, W]`` mask pair.

    Returns float32 arrays of the input shapes; images are clipped to
    ``[0, 1]`` and masks stay exactly 0 or 1.
    """
    out_images = np.empty_like(images, dtype=np.float32)
    out_masks = np.empty_like(masks, dtype=np.float32)
    for i, (image, mask) in enumerate(zip(images, masks, strict=True)):
        result = pipeline(image=np.ascontiguousarray(np.moveaxis(image, 0, -1), dtype=np.float32),
                          mask=np.ascontiguousarray(np.moveaxis(mask, 0, -1), dtype=np.uint8))
        out_images[i] = np.moveaxis(np.clip(result["image"], 0.0, 1.0), -1, 0)
        out_masks[i] = np.moveaxis(result["mask"].reshape(*result["mask"].shape[:2], -1), -1, 0)
    return out_images, out_masks
