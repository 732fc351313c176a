"""Minibatches from in-memory arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsm_core.data.arrays import SegArrays
from fedsm_core.training.batches import batches_per_pass, iterate_batches


def _data(count: int) -> SegArrays:
    images = np.arange(count, dtype=np.float32).reshape(count, 1, 1, 1) * np.ones((1, 3, 4, 4), np.float32)
    masks = (images[:, :1] > count / 2).astype(np.float32)
    return SegArrays(images, masks, tuple(str(i) for i in range(count)))


def test_training_batches_cover_every_image_once_and_never_hold_a_single_image():
    # 9 images in batches of 4 would leave one alone: it joins the previous batch -> [4, 5]
    batches = list(iterate_batches(_data(9), 4, shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert [len(images) for images, _ in batches] == [4, 5]
    seen = sorted(int(v) for images, _ in batches for v in images[:, 0, 0, 0])
    assert seen == list(range(9))


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 8, 9, 12, 13, 17])
def test_batches_per_pass_counts_what_a_training_pass_yields(count):
    counted = sum(1 for _ in iterate_batches(_data(count), 4, shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert batches_per_pass(count, 4) == counted


def test_evaluation_batches_keep_order_and_sizes():
    batches = list(iterate_batches(_data(9), 4, shuffle=False))
    assert [len(images) for images, _ in batches] == [4, 4, 1]
    assert [int(v) for v in batches[0][0][:, 0, 0, 0]] == [0, 1, 2, 3]


def test_flips_move_image_and_mask_together():
    # Prepare: a mask that equals channel 0 of the image
    rng = np.random.default_rng(0)
    images = rng.random((8, 3, 5, 5)).astype(np.float32)
    masks = images[:, :1].copy()
    data = SegArrays(images, masks, tuple(str(i) for i in range(8)))

    # Execute
    batches = list(iterate_batches(data, 8, shuffle=True, augment=True, generator=torch.Generator().manual_seed(3)))

    # Assert
    for batch_images, batch_masks in batches:
        assert torch.equal(batch_images[:, :1], batch_masks)
