"""Minibatches from in-memory site arrays, with paired image/mask augmentation."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from fedsm_core.data.arrays import SegArrays


def iterate_batches(
    data: SegArrays,
    batch_size: int,
    shuffle: bool,
    augment: bool = False,
    generator: torch.Generator | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(images, masks)`` float tensors of at most ``batch_size`` items.

    Augmentation flips image and mask together (horizontal and vertical flips,
    each with probability 1/2), so the pair stays aligned.

    Parameters
    ----------
    data : SegArrays
        Images ``[N, C, H, W]`` and masks ``[N, S, H, W]``.
    batch_size : int
    shuffle : bool
        Draw a new order each call (from ``generator``).
    augment : bool
        Apply random flips.
    generator : torch.Generator, optional
        Source of randomness, for reproducible runs.
    """
    count = len(data.images)
    if count == 0:
        raise ValueError("iterate_batches: the split holds no images")
    order = torch.randperm(count, generator=generator) if shuffle else torch.arange(count)
    images_all = torch.from_numpy(np.ascontiguousarray(data.images))
    masks_all = torch.from_numpy(np.ascontiguousarray(data.masks))
    for start in range(0, count, batch_size):
        index = order[start : start + batch_size]
        images, masks = images_all[index], masks_all[index]
        if augment:
            images, masks = _flip_pairs(images, masks, generator)
        yield images, masks


def _flip_pairs(
    images: torch.Tensor, masks: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    draws = torch.rand(2, len(images), generator=generator) < 0.5
    for axis, flip in zip((-1, -2), draws, strict=True):
        if flip.any():
            images[flip] = images[flip].flip(axis)
            masks[flip] = masks[flip].flip(axis)
    return images, masks
