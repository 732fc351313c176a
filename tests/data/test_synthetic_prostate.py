"""Tests of the deterministic six-site synthetic prostate MR generator."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from support import site_generators

from fedsm_core.data import synthetic_fundus, synthetic_prostate
from fedsm_core.data.cases import named_case
from fedsm_core.data.synthetic_prostate import (
    PAPER_SITE_SIZES,
    PROSTATE_SITES,
    generate_site,
    generate_sites,
    site_size,
    voxel_spacing,
)

SIZE = 64
SCALE = 0.1  # 16..47 slices in 6 cases per site: the whole module stays around a second


@pytest.fixture(scope="module")
def sites():
    return generate_sites(image_size=SIZE, scale=SCALE, seed=0)


@pytest.fixture(scope="module")
def site_2():
    """16 cases of 9..15 slices (192 slices, scale 0.5): long enough to look along z."""
    return generate_site(1, image_size=SIZE, scale=0.5, seed=0)


@pytest.fixture(scope="module")
def fundus_sites():
    return synthetic_fundus.generate_sites(image_size=SIZE, scale=SCALE, seed=0)


def _all(site, field):
    return np.concatenate([getattr(getattr(site, s), field) for s in ("train", "val", "test")])


def _grey(site):
    return _all(site, "images")[:, 0]


def _ids(site):
    return site.train.ids + site.val.ids + site.test.ids


def _case(example_id):
    return example_id.rpartition("/")[0]


def _cases(site):
    """Case -> indices of its slices in the concatenated splits, in z order."""
    cases = {}
    for index, example_id in enumerate(_ids(site)):
        cases.setdefault(_case(example_id), []).append(index)
    return cases


def test_profiles_and_paper_sizes():
    assert [s.name for s in PROSTATE_SITES] == [f"site-{i}" for i in range(1, 7)]
    assert PAPER_SITE_SIZES == (261, 384, 158, 468, 421, 175)
    with pytest.raises(AttributeError):
        PROSTATE_SITES[0].noise_std = 0.5  # frozen


def test_shapes_dtypes_and_ids(sites):
    assert len(sites) == 6
    for index, site in enumerate(sites):
        assert site.name == PROSTATE_SITES[index].name
        for split in (site.train, site.val, site.test):
            n = len(split.ids)
            assert n >= 2  # two cases of at least one slice
            assert split.images.shape == (n, 3, SIZE, SIZE)
            assert split.masks.shape == (n, 1, SIZE, SIZE)
            assert split.images.dtype == np.float32 and split.masks.dtype == np.float32
            assert split.images.min() >= 0.0 and split.images.max() <= 1.0
        ids = _ids(site)
        # The slice budget is the site size, whatever the number of cases.
        assert len(set(ids)) == len(ids) == site_size(index, SCALE)
        assert ids[0] == f"{site.name}/case000/z000"
        assert all(re.fullmatch(rf"{site.name}/case\d{{3}}/z\d{{3}}", i) for i in ids), ids


def test_slices_of_a_case_are_consecutive_and_in_z_order(sites):
    for site in sites:
        cases = _cases(site)
        assert len(cases) == 6  # every site is at the 6-case minimum at scale 0.1
        for case, indices in cases.items():
            assert indices == list(range(indices[0], indices[0] + len(indices))), case
            assert [_ids(site)[i] for i in indices] == [f"{case}/z{z:03d}" for z in range(len(indices))]


def test_no_case_in_two_splits_and_val_test_get_two_cases_or_more(sites, site_2):
    for site in [*sites, site_2]:
        train, val, test = ({_case(i) for i in split.ids} for split in (site.train, site.val, site.test))
        assert not (train & val or train & test or val & test), site.name
        assert len(val) >= 2 and len(test) >= 2 and len(train) >= 2, site.name


def test_grey_slice_replicated_into_three_channels(sites):
    for site in sites:
        images = _all(site, "images")
        assert np.array_equal(images[:, 0], images[:, 1]), site.name
        assert np.array_equal(images[:, 0], images[:, 2]), site.name


def test_masks_binary_and_plausibly_sized(sites):
    for site in sites:
        masks = _all(site, "masks")
        assert set(np.unique(masks).tolist()) <= {0.0, 1.0}
        area = masks[:, 0].mean(axis=(1, 2))
        assert np.all(area < 0.15), site.name
        assert np.mean(area > 0) > 0.6, site.name  # short cases (2..8 slices) rarely miss it
        for case, indices in _cases(site).items():
            assert area[indices].max() > 0.02, case  # every case shows its gland


def test_gland_area_rises_to_one_peak_then_falls_within_a_case(site_2):
    area = _all(site_2, "masks")[:, 0].sum(axis=(1, 2))
    # A few end slices of a case miss the gland (about 2 of 12 here), most hold it.
    assert 0.05 < np.mean(area == 0) < 0.35
    for case, indices in _cases(site_2).items():
        a, peak = area[indices], int(area[indices].argmax())
        # Monotone up to the peak and down after it (2 % of the peak for pixel rounding).
        assert np.all(np.diff(a[: peak + 1]) >= -0.02 * a[peak]), (case, a)
        assert np.all(np.diff(a[peak:]) <= 0.02 * a[peak]), (case, a)
        # Empty slices only at the ends: the slices with gland form one run.
        present = np.flatnonzero(a > 0)
        assert np.array_equal(present, np.arange(present[0], present[-1] + 1)), (case, a)


def test_neighbouring_slices_of_a_case_are_coherent(site_2):
    masks, images = _all(site_2, "masks")[:, 0] > 0, _grey(site_2)
    dice, image_step = [], []
    for indices in _cases(site_2).values():
        for a, b in itertools.pairwise(indices):
            image_step.append(np.abs(images[b] - images[a]).mean())
            if masks[a].any() and masks[b].any():
                dice.append(2.0 * (masks[a] & masks[b]).sum() / (masks[a].sum() + masks[b].sum()))
    # About 0.83 mean and 0.92 median: the gland changes a little from slice to slice,
    # most at the apex and base where it ends.
    assert np.mean(dice) > 0.78 and np.median(dice) > 0.88
    # Neighbouring slices differ less than the middle slices of consecutive cases
    # (about 0.03 against 0.08 mean absolute difference).
    middles = [indices[len(indices) // 2] for indices in _cases(site_2).values()]
    between = [np.abs(images[b] - images[a]).mean() for a, b in itertools.pairwise(middles)]
    assert np.mean(image_step) < 0.6 * np.mean(between)


def test_gland_is_darker_than_its_surroundings(sites):
    for site in sites:
        images, masks = _grey(site), _all(site, "masks")[:, 0] > 0
        visible = masks.sum(axis=(1, 2)) >= 20  # a gland of a few pixels blurs into its ring
        images, masks = images[visible], masks[visible]
        ring = masks.copy()
        for _ in range(3):  # dilate by 3 px, 4-connected
            grown = ring.copy()
            grown[:, 1:] |= ring[:, :-1]
            grown[:, :-1] |= ring[:, 1:]
            grown[:, :, 1:] |= ring[:, :, :-1]
            grown[:, :, :-1] |= ring[:, :, 1:]
            ring = grown
        ring &= ~masks
        inside = (images * masks).sum(axis=(1, 2)) / masks.sum(axis=(1, 2))
        around = (images * ring).sum(axis=(1, 2)) / ring.sum(axis=(1, 2))
        assert np.mean(inside < around) > 0.9, site.name


def test_gland_is_not_an_intensity_band(sites):
    # Even with the band of gland intensities known (an oracle), thresholding
    # also picks up background edges, rectum wall and texture.
    for site in sites:
        images, masks = _grey(site), _all(site, "masks")[:, 0] > 0
        present = masks.any(axis=(1, 2))
        images, masks = images[present], masks[present]
        dice = []
        for image, mask in zip(images, masks, strict=True):
            low, high = np.percentile(image[mask], [5, 95])
            band = (image >= low) & (image <= high)
            dice.append(2.0 * (band & mask).sum() / (band.sum() + mask.sum()))
        assert np.mean(dice) < 0.85, site.name


def test_deterministic_and_seed_dependent():
    site_generators.check_deterministic_and_seed_dependent(synthetic_prostate, SCALE)


def test_site_generated_alone_matches_site_in_federation(sites):
    site_generators.check_site_alone_matches_federation(synthetic_prostate, sites, SIZE, SCALE)


@pytest.mark.parametrize(
    ("site_index", "scale", "cases"),
    # site_size -> cases = max(6, round(slices / 12)) -> val = test = max(2, cases // 4)
    [(2, 0.1, (2, 2, 2)),  # 16 slices -> 6 cases
     (0, 0.5, (7, 2, 2)),  # 130 slices -> 11 cases
     (1, 0.5, (8, 4, 4)),  # 192 slices -> 16 cases
     (3, 1.0, (21, 9, 9))],  # 468 slices -> 39 cases
)
def test_split_sizes_in_cases(site_index, scale, cases):
    site = generate_site(site_index, image_size=32, scale=scale)
    assert tuple(len({_case(i) for i in split.ids}) for split in (site.train, site.val, site.test)) == cases
    assert len(site.train) + len(site.val) + len(site.test) == site_size(site_index, scale)


def test_every_generated_case_carries_its_sites_voxel_spacing():
    site = generate_site(2, 64, 0.3, seed=1)
    for split in (site.train, site.val, site.test):
        cases = {named_case(i) for i in split.ids}
        assert cases and all(split.spacings[case] == voxel_spacing(2, 64) for case in cases)


def test_voxel_spacing():
    assert voxel_spacing(0, 64) == (3.6, 2.5, 2.5)  # 160 mm / (zoom 1.00 * 64 px)
    assert voxel_spacing(5, 128) == pytest.approx((3.6, 160.0 / (1.03 * 128), 160.0 / (1.03 * 128)))


def test_site_size():
    assert site_size(0, 0.01) == 8
    assert site_size(5, 1.0) == 175
    assert site_size(3, 0.5) == round(468 * 0.5)
    assert [site_size(i, 2.0) for i in range(6)] == [2 * n for n in PAPER_SITE_SIZES]


def _f_statistic(groups):
    """One-way ANOVA F: variance of site means over variance within sites."""
    pooled = np.concatenate(groups)
    between = sum(len(g) * (g.mean() - pooled.mean()) ** 2 for g in groups) / (len(groups) - 1)
    within = sum(((g - g.mean()) ** 2).sum() for g in groups) / (len(pooled) - len(groups))
    return between / within


def test_sites_differ_mildly_compared_with_fundus(sites, fundus_sites):
    per_image = [_grey(s).mean(axis=(1, 2)) for s in sites]
    # The sites are not identical: site means differ beyond chance (F ~ 1 for
    # six copies of one profile, about 6 here)...
    assert _f_statistic(per_image) > 3.0
    # ...but their mean intensities are far closer than the fundus sites' are.
    prostate = [m.mean() for m in per_image]
    fundus = [_all(s, "images").mean() for s in fundus_sites]
    assert np.std(prostate) < 0.25 * np.std(fundus)


def test_no_label_shift_gland_area_alike_across_sites(sites):
    area = [_all(s, "masks").mean() for s in sites]
    assert max(area) < 1.4 * min(area)


def test_bias_field_direction_follows_site(sites):
    # The anatomy is left-right symmetric on average: any asymmetry is bias.
    asymmetry = []
    for site, profile in zip(sites, PROSTATE_SITES, strict=True):
        images = _grey(site)
        half = SIZE // 2
        ratio = (images[:, :, half:].mean() - images[:, :, :half].mean()) / images.mean()
        asymmetry.append(ratio)
        horizontal = profile.bias_strength * math.cos(math.radians(profile.bias_angle))
        if abs(horizontal) >= 0.1:
            assert np.sign(ratio) == np.sign(horizontal) and abs(ratio) > 0.03, site.name
        else:
            assert abs(ratio) < 0.05, site.name
    assert asymmetry[3] - asymmetry[2] > 0.1  # bias to the right vs to the left


def test_background_noise_matches_site_noise_level(sites):
    # In the air the signal is 0, so the Rician magnitude has mean sigma*sqrt(pi/2).
    for site, profile in zip(sites, PROSTATE_SITES, strict=True):
        images = _grey(site)
        corners = np.concatenate([images[:, :4, :4], images[:, :4, -4:],
                                  images[:, -4:, :4], images[:, -4:, -4:]], axis=1)
        sigma = corners.mean() / math.sqrt(math.pi / 2.0)
        assert sigma == pytest.approx(profile.noise_std, rel=0.15), site.name


def test_low_resolution_sites_are_blurrier(sites):
    sharpness = [np.percentile(np.abs(np.diff(_grey(s), axis=2)), 99, axis=(1, 2)).mean()
                 for s in sites]
    # site-1 and site-3 are sharp; site-4 (1.5x voxels) and site-6 (2x) are not.
    for sharp, blurred in itertools.product((0, 2), (3, 5)):
        assert sharpness[sharp] > 1.3 * sharpness[blurred], (sharp, blurred)


@pytest.mark.parametrize(("function", "args", "kwargs", "name"), site_generators.BAD_ARGUMENTS)
def test_bad_arguments_raise(function, args, kwargs, name):
    site_generators.check_bad_argument(synthetic_prostate, function, args, kwargs, name)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: generate_site(True), "site_index"),
        (lambda: generate_site(0, scale="0.5"), "scale"),
        (lambda: voxel_spacing(6, 64), "site_index"),
        (lambda: voxel_spacing(0, 16), "image_size"),
    ],
)
def test_prostate_specific_bad_arguments_raise(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_error_message_names_value_and_range():
    site_generators.check_error_names_value_and_range(synthetic_prostate)
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0, got inf"):
        generate_site(0, scale=float("inf"))
