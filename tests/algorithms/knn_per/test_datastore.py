"""kNN-Per's datastore: boundary pixels, stratified sampling, capacity and replacement."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.algorithms.knn_per.datastore import (
    KNNDatastore,
    boundary_pixels,
    pixel_strata,
    stratified_pixel_indices,
)


def _numbered(start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Entries whose one-dimensional embedding is their arrival number."""
    ids = np.arange(start, start + count, dtype=np.float32)[:, None]
    return ids, np.zeros((count, 1), np.float32)


def test_boundary_marks_both_sides_of_a_label_change():
    # Prepare: one foreground pixel at (2, 2) of a 5x5 mask
    mask = np.zeros((1, 5, 5), np.float32)
    mask[0, 2, 2] = 1.0

    # Execute
    boundary = boundary_pixels(mask)

    # Assert: the pixel and its 8 neighbours (rows/cols 1..3); the image border is no change
    expected = np.zeros((5, 5), bool)
    expected[1:4, 1:4] = True
    np.testing.assert_array_equal(boundary, expected)


def test_boundary_sees_a_change_of_any_structure():
    # Prepare: disc everywhere, cup only in column 0 -> the label vector changes between columns 0 and 1
    mask = np.zeros((2, 3, 4), np.float32)
    mask[0] = 1.0
    mask[1, :, 0] = 1.0

    # Execute
    boundary = boundary_pixels(mask)

    # Assert
    assert boundary[:, :2].all()
    assert not boundary[:, 2:].any()


def test_strata_are_background_each_structure_and_boundary():
    # Prepare: fundus-like [S, 3, 3]: disc = middle row (pixels 3..5), cup = centre pixel 4 inside it
    mask = np.zeros((2, 3, 3), np.float32)
    mask[0, 1, :] = 1.0
    mask[1, 1, 1] = 1.0

    # Execute
    background, disc, cup, boundary = pixel_strata(mask)

    # Assert: flat indices of a 3x3 grid
    np.testing.assert_array_equal(background, [0, 1, 2, 6, 7, 8])
    np.testing.assert_array_equal(disc, [3, 4, 5])
    np.testing.assert_array_equal(cup, [4])
    assert len(boundary) == 9  # every pixel touches a different label vector


def test_sampling_keeps_rare_foreground_and_boundary_pixels():
    # Prepare: 3 foreground pixels in 64x64 (0.07 %); a uniform sample of 64 would expect 0.05 of them
    mask = np.zeros((1, 64, 64), np.float32)
    mask[0, 30, 30:33] = 1.0
    foreground = {30 * 64 + 30, 30 * 64 + 31, 30 * 64 + 32}
    boundary = set(np.flatnonzero(boundary_pixels(mask)).tolist())

    # Execute
    chosen = stratified_pixel_indices(mask, 64, np.random.default_rng(0))

    # Assert: 64 distinct pixels; share = 64 // 3 strata = 21, more than the 3 foreground and
    # the 15 boundary pixels (rows 29..31 x cols 29..33), so every one of them is in
    assert len(chosen) == 64 and len(set(chosen.tolist())) == 64
    assert len(boundary) == 15
    assert foreground <= set(chosen.tolist())
    assert boundary <= set(chosen.tolist())


def test_sampling_takes_every_pixel_when_asked_for_more():
    # Prepare
    mask = np.zeros((1, 4, 4), np.float32)

    # Execute
    chosen = stratified_pixel_indices(mask, 100, np.random.default_rng(0))

    # Assert
    np.testing.assert_array_equal(chosen, np.arange(16))


def test_sampling_returns_exactly_count_when_strata_outnumber_it():
    # Prepare: 4 non-empty strata (background, disc, cup, boundary) but only 2 pixels asked
    mask = np.zeros((2, 8, 8), np.float32)
    mask[0, 2:6, 2:6] = 1.0
    mask[1, 3:5, 3:5] = 1.0

    # Execute
    chosen = stratified_pixel_indices(mask, 2, np.random.default_rng(0))

    # Assert
    assert len(set(chosen.tolist())) == 2


def test_store_never_exceeds_capacity():
    # Prepare
    store = KNNDatastore(capacity=5, replacement="fifo")
    sizes = []

    # Execute
    for start, count in ((0, 3), (3, 4), (7, 1), (8, 12)):
        store.add(*_numbered(start, count))
        sizes.append(len(store))

    # Assert
    assert sizes == [3, 5, 5, 5]
    assert store.embeddings.shape == (5, 1) and store.labels.shape == (5, 1)


@pytest.mark.parametrize(
    ("batches", "kept"),
    [
        ([3, 4], [2, 3, 4, 5, 6]),  # 7 entries in a store of 5: entries 0 and 1 are dropped
        ([5, 1, 1], [2, 3, 4, 5, 6]),
        ([2, 9], [6, 7, 8, 9, 10]),  # a batch larger than the store keeps its newest 5
        ([5, 5, 2], [7, 8, 9, 10, 11]),
    ],
)
def test_fifo_drops_the_oldest_entries(batches, kept):
    # Prepare
    store = KNNDatastore(capacity=5, replacement="fifo")

    # Execute
    start = 0
    for count in batches:
        store.add(*_numbered(start, count))
        start += count

    # Assert
    assert sorted(store.embeddings[:, 0].astype(int).tolist()) == kept


def _random_store(seed: int) -> KNNDatastore:
    store = KNNDatastore(capacity=6, replacement="random", seed=seed)
    for start in range(0, 40, 4):
        store.add(*_numbered(start, 4))
    return store


def test_random_replacement_stays_at_capacity_and_is_reproducible():
    # Prepare / Execute
    first, again, other = _random_store(3), _random_store(3), _random_store(4)

    # Assert
    assert len(first) == 6
    np.testing.assert_array_equal(first.embeddings, again.embeddings)
    assert not np.array_equal(first.embeddings, other.embeddings)
    # unlike FIFO, random replacement does not keep exactly the newest 6 (34..39)
    assert sorted(first.embeddings[:, 0].tolist()) != list(range(34, 40))


def test_add_images_stores_each_sampled_pixel_with_its_own_label():
    # Prepare: the embedding of a pixel is its (image, flat index); labels from a fixed mask
    height, width = 8, 8
    flat = np.arange(height * width, dtype=np.float32).reshape(height, width)
    embeddings = np.stack([np.stack([np.full_like(flat, b), flat]) for b in range(2)])  # [2, 2, 8, 8]
    masks = np.zeros((2, 1, height, width), np.float32)
    masks[:, 0, 2:5, 3:6] = 1.0
    store = KNNDatastore(capacity=100)

    # Execute
    store.add_images(embeddings, masks, pixels_per_image=10)

    # Assert
    assert len(store) == 20 and store.embeddings.dtype == np.float32
    for (image, pixel), label in zip(store.embeddings.astype(int), store.labels[:, 0], strict=True):
        assert label == masks[image, 0].reshape(-1)[pixel]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity": 0}, "knn-capacity = 0 must be >= 1"),
        ({"capacity": 5, "replacement": "lru"}, "knn-replacement = 'lru'"),
    ],
)
def test_bad_store_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KNNDatastore(**kwargs)


def test_entries_of_another_width_are_rejected():
    # Prepare
    store = KNNDatastore(capacity=5)
    store.add(np.zeros((2, 3), np.float32), np.zeros((2, 1), np.float32))

    # Execute / Assert
    with pytest.raises(ValueError, match="dim 4 with 1 structures, but the store holds dim 3"):
        store.add(np.zeros((2, 4), np.float32), np.zeros((2, 1), np.float32))
