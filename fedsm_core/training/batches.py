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
    each with probability 1/2), so the pair stays aligned. When shuffling (for
    training), a last batch of a single image joins the batch before it: batch
    normalization cannot train on one image, and no image is left out.

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
    starts = list(range(0, count, batch_size))
    if shuffle and len(starts) > 1 and count - starts[-1] == 1:
        starts.pop()
    ends = [*starts[1:], count]
    for start, end in zip(starts, ends, strict=True):
        index = order[start:end]
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
