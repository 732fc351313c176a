"""Paired image/mask augmentation: the "affine" policy and its use by iterate_batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsm_core.data.arrays import SegArrays
from fedsm_core.data.augment import augment_pairs, build_augmentation
from fedsm_core.training.batches import iterate_batches

SIZE = 32
COUNT = 8


def _ellipses(count: int = COUNT, structures: int = 1) -> SegArrays:
    """Off-centre ellipses (flips and rotations move them); images bright (0.9) on the mask, 0.1 elsewhere."""
    yy, xx = np.mgrid[:SIZE, :SIZE]
    masks = np.zeros((count, structures, SIZE, SIZE), np.float32)
    for i in range(count):
        cy, cx = 8 + i, 10 + 2 * i
        masks[i, 0] = (yy - cy) ** 2 / 36 + (xx - cx) ** 2 / 100 <= 1
        if structures > 1:
            masks[i, 1] = (yy - cy) ** 2 / 4 + (xx - cx) ** 2 / 16 <= 1
    images = np.repeat(masks[:, :1] * 0.8 + 0.1, 3, axis=1).astype(np.float32)
    return SegArrays(images, masks, tuple(str(i) for i in range(count)))


def _batches(data, policy, seed, batch_size=4, shuffle=False):
    return list(iterate_batches(data, batch_size, shuffle=shuffle, augment=policy,
                                generator=torch.Generator().manual_seed(seed)))


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / (a | b).sum())


def test_affine_keeps_masks_exactly_binary_and_images_in_unit_range():
    data = _ellipses(structures=2)

    batches = _batches(data, "affine", seed=0)

    assert [tuple(images.shape) for images, _ in batches] == [(4, 3, SIZE, SIZE)] * 2
    assert [tuple(masks.shape) for _, masks in batches] == [(4, 2, SIZE, SIZE)] * 2
    for images, masks in batches:
        assert images.dtype == torch.float32 and masks.dtype == torch.float32
        assert set(torch.unique(masks).tolist()) <= {0.0, 1.0}
        assert float(images.min()) >= 0.0 and float(images.max()) <= 1.0


def test_affine_keeps_image_and_mask_aligned():
    # The photometric step changes the grey levels but keeps the bright region (0.9 +- 0.2 vs 0.1 +- 0.2),
    # so the bright pixels of the warped image must coincide with the warped mask.
    data = _ellipses()

    for seed in range(3):
        for images, masks in _batches(data, "affine", seed=seed):
            bright = images[:, 0].numpy() > 0.5
            target = masks[:, 0].numpy() > 0.5
            for k in range(len(images)):
                assert _iou(bright[k], target[k]) > 0.9, f"seed {seed}, image {k}"


def test_affine_actually_changes_the_data():
    data = _ellipses()

    images, masks = _batches(data, "affine", seed=0, batch_size=COUNT)[0]

    assert not np.array_equal(masks.numpy(), data.masks)
    assert not np.allclose(images.numpy(), data.images)


def test_affine_keeps_the_second_structure_inside_the_first():
    # the cup stays within the disc: both planes get the same warp
    data = _ellipses(structures=2)

    for _images, masks in _batches(data, "affine", seed=1):
        outer, inner = masks[:, 0].numpy() > 0.5, masks[:, 1].numpy() > 0.5
        assert inner.any()
        assert (inner & ~outer).sum() <= 2  # at most a stray boundary pixel from nearest sampling


def test_same_generator_seed_gives_identical_batches_and_another_seed_different_ones():
    data = _ellipses()

    first = _batches(data, "affine", seed=7, shuffle=True)
    again = _batches(data, "affine", seed=7, shuffle=True)
    other = _batches(data, "affine", seed=8, shuffle=True)

    for (i1, m1), (i2, m2) in zip(first, again, strict=True):
        assert torch.equal(i1, i2) and torch.equal(m1, m2)
    assert any(not torch.equal(i1, i3) for (i1, _), (i3, _) in zip(first, other, strict=True))


def test_none_returns_the_data_unchanged():
    data = _ellipses()

    batches = _batches(data, "none", seed=0)

    assert np.array_equal(torch.cat([images for images, _ in batches]).numpy(), data.images)
    assert np.array_equal(torch.cat([masks for _, masks in batches]).numpy(), data.masks)


def test_booleans_still_mean_flip_and_none():
    data = _ellipses()

    as_true = _batches(data, True, seed=5)
    as_flip = _batches(data, "flip", seed=5)
    as_false = _batches(data, False, seed=5)

    for (i1, m1), (i2, m2) in zip(as_true, as_flip, strict=True):
        assert torch.equal(i1, i2) and torch.equal(m1, m2)
    assert np.array_equal(torch.cat([i for i, _ in as_false]).numpy(), data.images)
    assert not np.array_equal(torch.cat([i for i, _ in as_true]).numpy(), data.images)


def test_augmentation_never_changes_the_stored_arrays():
    data = _ellipses()
    images, masks = data.images.copy(), data.masks.copy()

    _batches(data, "affine", seed=0)
    _batches(data, "flip", seed=0)

    assert np.array_equal(data.images, images) and np.array_equal(data.masks, masks)


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="'rotate'.*none.*flip.*affine"):
        list(iterate_batches(_ellipses(), 4, shuffle=False, augment="rotate"))
    with pytest.raises(ValueError, match="'rotate'"):
        build_augmentation("rotate", seed=0)


def test_none_policy_builds_no_pipeline():
    assert build_augmentation("none", seed=0) is None


def test_augment_pairs_keeps_shapes_for_one_structure_and_grey_images():
    data = _ellipses(count=2)
    grey = data.images[:, :1]

    images, masks = augment_pairs(grey, data.masks, build_augmentation("affine", seed=3))

    assert images.shape == (2, 1, SIZE, SIZE) and images.dtype == np.float32
    assert masks.shape == (2, 1, SIZE, SIZE) and masks.dtype == np.float32
    assert set(np.unique(masks).tolist()) <= {0.0, 1.0}
