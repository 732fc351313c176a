"""Shared preprocessing of real images: resizing, normalization, channel layout, splits."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.data.preprocess import (
    normalize_image,
    prepare_example,
    resize_image,
    resize_mask,
    split_off,
    stack_examples,
    to_channels_first,
)


def test_shrinking_averages_each_block_of_pixels():
    checkerboard = (np.indices((4, 4)).sum(axis=0) % 2).astype(np.float32)
    ramp = np.arange(16, dtype=np.float32).reshape(4, 4)

    # every 2x2 block of the checkerboard holds two 0s and two 1s
    assert resize_image(checkerboard, 2).tolist() == [[0.5, 0.5], [0.5, 0.5]]
    # block means: (0+1+4+5)/4, (2+3+6+7)/4, (8+9+12+13)/4, (10+11+14+15)/4
    assert resize_image(ramp, 2).tolist() == [[2.5, 4.5], [10.5, 12.5]]


def test_shrinking_keeps_channels_and_value_range():
    rgb = np.zeros((4, 4, 3), np.float32)
    rgb[..., 0] = 200.0
    rgb[:2, :2, 1] = 100.0

    out = resize_image(rgb, 2)

    assert out.shape == (2, 2, 3) and out.dtype == np.float32
    assert out[..., 0].tolist() == [[200.0, 200.0], [200.0, 200.0]]
    assert out[..., 1].tolist() == [[100.0, 0.0], [0.0, 0.0]]
    assert out[..., 2].tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_enlarging_interpolates_within_the_range():
    image = np.array([[0.0, 10.0], [0.0, 10.0]], np.float32)

    out = resize_image(image, 4)

    assert out.shape == (4, 4)
    assert out.min() >= 0.0 and out.max() <= 10.0
    assert 0.0 < out[0, 1] < 10.0  # a value between the two columns: not nearest neighbour
    np.testing.assert_allclose(out[0], out[3])  # rows were equal, they stay equal


def test_resize_mask_is_nearest_and_stays_binary():
    # Shrinking 8 -> 4, nearest samples the pixel centres 1, 3, 5, 7 of each axis.
    stripes = np.zeros((1, 8, 8), bool)
    stripes[0, :, 0::2] = True  # only unsampled columns: nearest drops them, averaging would keep half
    dots = np.zeros((1, 8, 8), bool)
    dots[0, 1, 1] = dots[0, 5, 3] = True  # sampled pixels: nearest keeps them, averaging gives 1/4
    square = np.zeros((1, 8, 8), bool)
    square[0, 2:6, 2:6] = True

    out = resize_mask(np.concatenate([stripes, dots, square]), 4)

    assert out.dtype == bool and out.shape == (3, 4, 4)
    assert not out[0].any()
    assert np.argwhere(out[1]).tolist() == [[0, 0], [2, 1]]
    expected = np.zeros((4, 4), bool)
    expected[1:3, 1:3] = True
    assert np.array_equal(out[2], expected)


def test_normalize_maps_the_percentile_window_to_unit_range_and_ignores_hot_pixels():
    # 1000 pixels sorted: 499 x 20, one 110, 496 x 200, 4 hot pixels at 5000.
    # 0.5th percentile at rank 4.995 -> 20; 99.5th at rank 994.005 -> 200.
    values = np.array([20.0] * 499 + [110.0] + [200.0] * 496 + [5000.0] * 4, np.float32)
    image = values.reshape(25, 40)

    out = normalize_image(image)

    assert out.dtype == np.float32
    expected = np.array([0.0] * 499 + [0.5] + [1.0] * 496 + [1.0] * 4, np.float32).reshape(25, 40)
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_normalize_uses_one_window_over_all_channels_so_a_colour_cast_survives():
    image = np.zeros((4, 4, 3), np.float32)
    image[..., 0] = 200.0
    image[..., 1] = 100.0

    out = normalize_image(image)

    np.testing.assert_allclose(out[..., 0], 1.0)
    np.testing.assert_allclose(out[..., 1], 0.5)
    np.testing.assert_allclose(out[..., 2], 0.0)


def test_normalize_maps_a_constant_image_to_zeros():
    out = normalize_image(np.full((3, 3), 77.0, np.float32))

    assert out.dtype == np.float32
    assert out.tolist() == [[0.0] * 3] * 3


def test_channels_first_repeats_grey_and_moves_colour_channels():
    grey = np.arange(6, dtype=np.float32).reshape(2, 3)
    rgb = np.stack([grey, grey + 10, grey + 20], axis=-1)
    rgba = np.concatenate([rgb, np.full((2, 3, 1), 99.0, np.float32)], axis=-1)

    for image in (grey, grey[..., None]):
        out = to_channels_first(image)
        assert out.shape == (3, 2, 3)
        for channel in range(3):
            assert np.array_equal(out[channel], grey)
    for image in (rgb, rgba):
        out = to_channels_first(image)
        assert out.shape == (3, 2, 3)
        for channel in range(3):
            assert np.array_equal(out[channel], grey + 10 * channel)


def test_prepare_example_gives_float32_channels_first_in_unit_range_and_binary_mask():
    image = np.zeros((8, 8), np.uint8)
    image[:4] = 255
    targets = np.zeros((2, 8, 8), bool)
    targets[0, :4] = True

    picture, mask = prepare_example(image, targets, 4)

    assert picture.shape == (3, 4, 4) and picture.dtype == np.float32
    assert mask.shape == (2, 4, 4) and mask.dtype == np.float32
    assert picture[0, :2].tolist() == [[1.0] * 4] * 2 and picture[0, 2:].tolist() == [[0.0] * 4] * 2
    assert mask[0].tolist() == [[1.0] * 4] * 2 + [[0.0] * 4] * 2
    assert not mask[1].any()


def test_stack_examples_with_no_examples_keeps_the_shapes():
    arrays = stack_examples([], [], num_structures=2, size=8)

    assert arrays.images.shape == (0, 3, 8, 8) and arrays.images.dtype == np.float32
    assert arrays.masks.shape == (0, 2, 8, 8) and arrays.masks.dtype == np.float32
    assert arrays.ids == ()
    assert len(arrays) == 0


def test_stack_examples_stacks_in_order_with_ids():
    examples = [(np.full((3, 2, 2), i, np.float32), np.full((1, 2, 2), i % 2, np.float32)) for i in range(3)]

    arrays = stack_examples(examples, ["s/a", "s/b", "s/c"], num_structures=1, size=2)

    assert arrays.images.shape == (3, 3, 2, 2) and arrays.masks.shape == (3, 1, 2, 2)
    assert arrays.images[:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0]
    assert arrays.ids == ("s/a", "s/b", "s/c")


STEMS = [f"case{i:02d}" for i in range(20)]


def test_split_off_is_deterministic_and_independent_of_listing_order():
    first = split_off(STEMS, 0.2, seed=3, salt="siteA")
    again = split_off(STEMS, 0.2, seed=3, salt="siteA")
    reversed_order = split_off(list(reversed(STEMS)), 0.2, seed=3, salt="siteA")

    assert first == again == reversed_order


@pytest.mark.parametrize(("count", "fraction", "taken"), [(20, 0.2, 4), (7, 0.2, 1), (13, 0.2, 3), (5, 0.0, 0),
                                                          (1, 0.2, 0), (3, 0.5, 2),
                                                          # at least one once there are two stems
                                                          (2, 0.2, 1), (4, 0.1, 1)])
def test_split_off_takes_round_fraction_of_n_at_least_one_and_covers_every_stem_once(count, fraction, taken):
    stems = STEMS[:count]

    kept, split = split_off(stems, fraction, seed=0, salt="site")

    assert len(split) == taken
    assert len(kept) == count - taken
    assert set(kept).isdisjoint(split)
    assert sorted(kept + split) == sorted(stems)
    assert kept == sorted(kept) and split == sorted(split)


def test_split_off_differs_with_the_salt_and_the_seed():
    _, site_a = split_off(STEMS, 0.5, seed=0, salt="siteA")
    _, site_b = split_off(STEMS, 0.5, seed=0, salt="siteB")
    _, seed_1 = split_off(STEMS, 0.5, seed=1, salt="siteA")

    assert site_a != site_b
    assert site_a != seed_1


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_split_off_rejects_fractions_outside_zero_to_one(fraction):
    with pytest.raises(ValueError, match="fraction"):
        split_off(STEMS, fraction, seed=0, salt="site")
