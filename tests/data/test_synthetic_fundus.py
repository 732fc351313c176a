"""Tests of the deterministic six-site synthetic fundus generator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support import site_generators

from fedsm_core.data import synthetic_fundus
from fedsm_core.data.arrays import SegArrays
from fedsm_core.data.synthetic_fundus import (
    FUNDUS_SITES,
    PAPER_SITE_SIZES,
    generate_site,
    generate_sites,
    site_size,
)

SIZE = 64
SCALE = 0.1  # 8..40 images per site: the whole module stays well under a second


@pytest.fixture(scope="module")
def sites():
    return generate_sites(image_size=SIZE, scale=SCALE, seed=0)


def _all(site, field):
    return np.concatenate([getattr(getattr(site, s), field) for s in ("train", "val", "test")])


def test_profiles_and_paper_sizes():
    assert [s.name for s in FUNDUS_SITES] == [f"site-{i}" for i in range(1, 7)]
    assert PAPER_SITE_SIZES == (50, 98, 47, 230, 80, 400)
    with pytest.raises(AttributeError):
        FUNDUS_SITES[0].gamma = 2.0  # frozen


def test_shapes_dtypes_and_ids(sites):
    assert len(sites) == 6
    for index, site in enumerate(sites):
        assert site.name == FUNDUS_SITES[index].name
        ids = []
        for split in (site.train, site.val, site.test):
            n = len(split.ids)
            assert split.images.shape == (n, 3, SIZE, SIZE)
            assert split.masks.shape == (n, 2, SIZE, SIZE)
            assert split.images.dtype == np.float32 and split.masks.dtype == np.float32
            assert split.images.min() >= 0.0 and split.images.max() <= 1.0
            ids += split.ids
        assert len(set(ids)) == len(ids) == site_size(index, SCALE)
        assert all(i.startswith(f"{site.name}/") for i in ids)


def test_masks_binary_cup_inside_nonempty_disc(sites):
    for site in sites:
        masks = _all(site, "masks")
        assert set(np.unique(masks).tolist()) <= {0.0, 1.0}
        disc, cup = masks[:, 0] > 0, masks[:, 1] > 0
        assert not np.any(cup & ~disc), site.name
        assert np.all(disc.sum(axis=(1, 2)) > 0), site.name
        assert np.all(cup.sum(axis=(1, 2)) > 0), site.name


def test_deterministic_and_seed_dependent():
    site_generators.check_deterministic_and_seed_dependent(synthetic_fundus, SCALE)


def test_site_generated_alone_matches_site_in_federation(sites):
    site_generators.check_site_alone_matches_federation(synthetic_fundus, sites, SIZE, SCALE)


@pytest.mark.parametrize(
    ("site_index", "scale", "expected"),
    [(0, 0.1, (4, 2, 2)), (1, 0.1, (6, 2, 2)), (0, 0.5, (13, 6, 6)), (3, 0.2, (24, 11, 11))],
)
def test_split_sizes(site_index, scale, expected):
    site = generate_site(site_index, image_size=32, scale=scale)
    assert (len(site.train), len(site.val), len(site.test)) == expected
    assert sum(expected) == site_size(site_index, scale)


def test_site_size():
    assert site_size(0, 0.01) == 8
    assert site_size(5, 1.0) == 400
    assert site_size(2, 0.5) == round(47 * 0.5)
    assert [site_size(i, 2.0) for i in range(6)] == [2 * n for n in PAPER_SITE_SIZES]


def test_sites_differ_in_colour(sites):
    colours = [_all(s, "images").mean(axis=(0, 2, 3)) for s in sites]
    for i, j in itertools.combinations(range(6), 2):
        assert np.abs(colours[i] - colours[j]).max() > 0.04, (i, j)


def test_annotation_protocols_differ(sites):
    # site-2 outlines inside the visible rim (-15%), site-3 outside (+20%) on
    # similar discs: about (1.2 / 0.85)^2 = 2x the annotated disc area.
    disc_area = [_all(s, "masks")[:, 0].mean() for s in sites]
    assert disc_area[2] > 1.5 * disc_area[1]
    cup_to_disc = [_all(s, "masks")[:, 1].sum() / _all(s, "masks")[:, 0].sum() for s in sites]
    assert cup_to_disc[0] > 2.0 * cup_to_disc[5]


@pytest.mark.parametrize(("function", "args", "kwargs", "name"), site_generators.BAD_ARGUMENTS)
def test_bad_arguments_raise(function, args, kwargs, name):
    site_generators.check_bad_argument(synthetic_fundus, function, args, kwargs, name)


def test_error_message_names_value_and_range():
    site_generators.check_error_names_value_and_range(synthetic_fundus)


def test_seg_arrays_rejects_inconsistent_sizes():
    images = np.zeros((2, 3, 8, 8), np.float32)
    with pytest.raises(ValueError, match="inconsistent"):
        SegArrays(images, np.zeros((2, 2, 8, 8), np.float32), ("a",))
    with pytest.raises(ValueError, match="inconsistent"):
        SegArrays(images, np.zeros((2, 2, 4, 4), np.float32), ("a", "b"))
