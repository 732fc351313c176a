"""Minibatches from in-memory site arrays, with paired image/mask augmentation."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from fedsm_core.data.arrays import SegArrays
from fedsm_core.data.augment import AUGMENTATIONS, augment_pairs, build_augmentation


def iterate_batches(
    data: SegArrays,
    batch_size: int,
    shuffle: bool,
    augment: bool | str = False,
    generator: torch.Generator | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(images, masks)`` float tensors of at most ``batch_size`` items.

    Augmentation changes image and mask together, so the pair stays aligned:
    ``"flip"`` flips (horizontal and vertical, each with probability 1/2),
    ``"affine"`` adds a small warp and brightness/contrast jitter
    (:mod:`fedsm_core.data.augment`). When shuffling (for
    training), a last batch of a single image joins the batch before it: batch
    normalization cannot train on one image, and no image is left out.

    Parameters
    ----------
    data : SegArrays
        Images ``[N, C, H, W]`` and masks ``[N, S, H, W]``.
    batch_size : int
    shuffle : bool
        Draw a new order each call (from ``generator``).
    augment : bool or str
        A policy of :data:`fedsm_core.data.augment.AUGMENTATIONS`; ``True``
        means ``"flip"`` and ``False`` ``"none"``.
    generator : torch.Generator, optional
        Source of randomness, for reproducible runs.
    """
    policy = {True: "flip", False: "none"}.get(augment, augment) if isinstance(augment, bool) else augment
    if policy not in AUGMENTATIONS:
        raise ValueError(f"augmentation = '{policy}' must be one of {AUGMENTATIONS}")
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
        if policy == "flip":
            images, masks = _flip_pairs(images, masks, generator)
        elif policy == "affine":
            images, masks = _warp_pairs(images, masks, generator)
        yield images, masks


def batches_per_pass(count: int, batch_size: int) -> int:
    """Minibatches of one shuffled pass over ``count`` images (:func:`iterate_batches`' rule for a last single image).

    ``ceil(count / batch_size)``, one fewer when the last batch would hold a
    single image of several batches (it joins the batch before it).
    """
    batches = -(-count // batch_size)
    return batches - 1 if batches > 1 and count % batch_size == 1 else batches


def _warp_pairs(
    images: torch.Tensor, masks: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    # The pipeline's seed comes from the batch generator, so a seeded round is reproducible.
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    warped = augment_pairs(images.numpy(), masks.numpy(), build_augmentation("affine", seed))
    return torch.from_numpy(warped[0]), torch.from_numpy(warped[1])


def _flip_pairs(
    images: torch.Tensor, masks: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    draws = torch.rand(2, len(images), generator=generator) < 0.5
    for axis, flip in zip((-1, -2), draws, strict=True):
        if flip.any():
            images[flip] = images[flip].flip(axis)
            masks[flip] = masks[flip].flip(axis)
    return images, masks
