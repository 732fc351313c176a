"""Tests of the case geometry of the synthetic prostate dataset (stacks of slices per patient)."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.data.synthetic_prostate import PAPER_SITE_SIZES, site_size
from fedsm_core.data.synthetic_prostate_cases import (
    case_count,
    case_ids,
    case_sizes,
    gland_heights,
    split_bounds,
    z_smooth_noise,
)


@pytest.mark.parametrize(
    ("num_slices", "expected"),
    [(6, 6), (8, 6), (72, 6), (79, 7), (130, 11), (192, 16), (468, 39)],  # max(6, round(n / 12))
)
def test_case_count(num_slices, expected):
    assert case_count(num_slices) == expected


def test_case_count_of_the_paper_sites_at_scale_half():
    # 130, 192, 79, 234, 210, 88 slices.
    assert [case_count(site_size(i, 0.5)) for i in range(len(PAPER_SITE_SIZES))] == [11, 16, 7, 20, 18, 7]


@pytest.mark.parametrize("bad", [5, 0, -3, 12.0, True, "12"])
def test_case_count_rejects_budgets_below_one_slice_per_case(bad):
    with pytest.raises(ValueError, match=rf"num_slices must be an integer >= 6 \(one slice per case\), got {bad!r}"):
        case_count(bad)


@pytest.mark.parametrize(("num_slices", "cases"), [(8, 6), (16, 6), (130, 11), (468, 39)])
def test_case_sizes_share_the_budget_exactly(num_slices, cases):
    sizes = case_sizes(np.random.default_rng(0), num_slices, cases)
    assert sizes.shape == (cases,)
    assert sizes.sum() == num_slices
    assert sizes.min() >= 1


def test_case_sizes_vary_a_little():
    # 11 cases of 130 slices: 1 + 119 * w / sum(w), w in [0.8, 1.2], edges rounded (+-1):
    # at least 1 + 119 * 0.8 / 12.8 - 1 = 7.4, at most 1 + 119 * 1.2 / 9.2 + 1 = 17.5.
    sizes = case_sizes(np.random.default_rng(3), 130, 11)
    assert sizes.min() >= 8 and sizes.max() <= 17
    assert len(set(sizes.tolist())) > 1


def test_equal_shares_when_one_slice_each():
    assert case_sizes(np.random.default_rng(0), 6, 6).tolist() == [1] * 6


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [([1] * 6, [0, 2, 4, 6]),  # 6 cases -> 2/2/2
     ([3, 1, 2, 2, 5, 4], [0, 4, 8, 17]),  # by cases, not by slices: 3+1 | 2+2 | 5+4
     ([12] * 11, [0, 84, 108, 132]),  # 11 cases -> 7/2/2
     ([10] * 16, [0, 80, 120, 160])],  # 16 cases -> 8/4/4
)
def test_split_bounds(sizes, expected):
    assert split_bounds(np.array(sizes)) == expected


def test_case_ids():
    assert case_ids("site-1", np.array([2, 1])) == ("site-1/case000/z000", "site-1/case000/z001",
                                                    "site-1/case001/z000")


def test_gland_heights_by_hand():
    # k = 4, fill = 1, shift = 0: t = (z - 1.5) / 2.
    # k = 4, fill = 0.5, shift = 0.5: half = 1, offset 0.5 * (2 - 1) = 0.5: t = z - 2.
    # k = 1, fill = 0.8: the one slice is mid-gland.
    t = gland_heights(np.array([4, 4, 1]), np.array([1.0, 0.5, 0.8]), np.array([0.0, 0.5, 0.0]))
    np.testing.assert_allclose(t, [-0.75, -0.25, 0.25, 0.75, -2.0, -1.0, 0.0, 1.0, 0.0])


def test_gland_spans_fill_of_the_stack():
    # 12 slices, fill 0.75, centred: t = (z - 5.5) / 4.5, inside the gland (|z - 5.5| < 4.5: z = 2..9).
    t = gland_heights(np.array([12]), np.array([0.75]), np.array([0.0]))
    assert np.flatnonzero(np.abs(t) < 1.0).tolist() == list(range(2, 10))


def test_z_smooth_noise_has_unit_variance_and_neighbours_correlate():
    sizes = np.array([12] * 400)
    noise = z_smooth_noise(np.random.default_rng(0), sizes, (5, 5), step=3)
    assert noise.shape == (4800, 5, 5) and noise.dtype == np.float32
    per_slice = noise.reshape(400, 12, 25)
    # Unit-norm weights: every slice has variance 1 (25 * 400 samples each).
    np.testing.assert_allclose(per_slice.var(axis=(0, 2)), 1.0, atol=0.1)
    neighbours = np.mean(per_slice[:, 1:] * per_slice[:, :-1])
    other_cases = np.mean(per_slice[1:] * per_slice[:-1])
    assert neighbours > 0.6 and abs(other_cases) < 0.05
