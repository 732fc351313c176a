"""The gap table: each method's client-average Dice minus centralized training's, paired on the same test images."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.study.gap_table import gap_table, paired_differences, paired_gap_interval, seed_gaps
from experiments.study.table import DISPLAY, study_table


def _image(method: str, seed: int, image: str, value: float, dataset: str = "d") -> dict[str, str]:
    return {"dataset": dataset, "method": method, "seed": str(seed), "kind": "image", "round": "10",
            "site": image.split("/")[0], "image": image, "value": repr(value)}


def _rows(method: str, seed: int, dice: dict[str, list[float]]) -> list[dict[str, str]]:
    return [_image(method, seed, f"{site}/{index:04d}", value)
            for site, values in dice.items() for index, value in enumerate(values)]


# Seed 0: site-1 differences +0.1, -0.1, +0.3 (mean +0.1); site-2 difference -0.2 (mean -0.2); gap -0.05.
# Seed 1: site-1 differences 0, 0, 0; site-2 difference +0.4; gap +0.2. Mean over seeds +0.075.
HAND = [
    *_rows("centralized", 0, {"site-1": [0.5, 0.9, 0.6], "site-2": [0.8]}),
    *_rows("fedsm", 0, {"site-1": [0.6, 0.8, 0.9], "site-2": [0.6]}),
    *_rows("centralized", 1, {"site-1": [0.7, 0.7, 0.7], "site-2": [0.5]}),
    *_rows("fedsm", 1, {"site-1": [0.7, 0.7, 0.7], "site-2": [0.9]}),
]


def test_the_seed_gap_is_the_difference_of_client_averages_computed_by_hand():
    gaps = seed_gaps(paired_differences(HAND, "fedsm"))

    assert gaps["0"] == pytest.approx((0.1 + -0.2) / 2, abs=1e-12)
    assert gaps["1"] == pytest.approx((0.0 + 0.4) / 2, abs=1e-12)


def test_a_constant_difference_gives_a_zero_width_interval_because_the_draws_are_paired():
    # Image Dice spread widely, yet every image gains exactly 0.02: an unpaired bootstrap would be wide.
    rng = np.random.default_rng(0)
    base = {"site-1": [float(v) for v in rng.uniform(0.3, 0.95, 12)],
            "site-2": [float(v) for v in rng.uniform(0.3, 0.95, 7)]}
    rows = [*_rows("centralized", 0, base),
            *_rows("fedavg", 0, {site: [v + 0.02 for v in values] for site, values in base.items()})]

    low, high = paired_gap_interval(paired_differences(rows, "fedavg"), 500, np.random.default_rng(1))

    assert low == pytest.approx(0.02, abs=1e-12)
    assert high == pytest.approx(0.02, abs=1e-12)


def test_the_unit_is_the_image_even_where_images_are_slices_of_cases():
    # Case a: one slice, difference +0.1; case b: nine slices, difference 0. Over slices a draw takes the
    # +0.1 slice k times out of 10 (k ~ Binomial(10, 0.1)): the 97.5th percentile is k = 3, a difference of
    # 0.03. A bootstrap over the two cases would reach 0.1 (both draws case a, p 1/4).
    ids = ["site-1/a/z000", *[f"site-1/b/z{k:03d}" for k in range(9)]]
    rows = [*[_image("centralized", 0, image, 0.5) for image in ids],
            _image("fedsm", 0, ids[0], 0.6), *[_image("fedsm", 0, image, 0.5) for image in ids[1:]]]

    low, high = paired_gap_interval(paired_differences(rows, "fedsm"), 4000, np.random.default_rng(2))

    assert low == pytest.approx(0.0, abs=1e-12)
    assert high == pytest.approx(0.03, abs=1e-12)


def test_runs_that_scored_different_test_images_are_refused_naming_the_seed_and_site():
    rows = [*_rows("centralized", 0, {"site-1": [0.5, 0.6]}), *_rows("fedsm", 0, {"site-1": [0.5]})]

    with pytest.raises(ValueError, match=r"seed 0, site-1: fedsm scored 1 test images and centralized 2"):
        paired_differences(rows, "fedsm")


def test_only_the_seeds_both_methods_finished_are_paired():
    rows = [*HAND, *_rows("fedsm", 2, {"site-1": [0.1], "site-2": [0.1]})]

    assert list(paired_differences(rows, "fedsm")) == ["0", "1"]


def test_the_table_reads_the_target_on_the_mean_and_on_the_interval():
    # Hand rows: gaps -5.00 and +20.00 points, mean +7.50; every draw's gap lies in [+2.5, +12.5] points.
    hand = gap_table(HAND, "d", DISPLAY, 200)
    # One seed, differences +3 and -3 points: mean 0 (target met), interval [-3, +3] (reaches below -0.5).
    spread = gap_table([*_rows("centralized", 0, {"site-1": [0.5, 0.5]}), *_rows("fedsm", 0, {"site-1": [0.53, 0.47]})],
                       "d", DISPLAY, 200)

    assert hand[2] == "| method | per seed | mean | 95 % paired CI | mean >= -0.50 | CI above -0.50 |"
    assert hand[4].startswith("| FedSM | -5.00 / +20.00 | +7.50 | [")
    assert hand[4].endswith("| yes | yes |")
    assert spread[4] == "| FedSM | +0.00 | +0.00 | [-3.00, +3.00] | yes | no |"


def test_without_centralized_per_image_rows_there_is_no_gap_table():
    rows = [r for r in HAND if r["method"] != "centralized"]

    assert gap_table(rows, "d", DISPLAY, 100) == []


def test_the_study_table_places_the_gap_table_under_the_dataset_table():
    tests = [{"dataset": "d", "method": m, "seed": str(s), "kind": "test", "round": "10", "site": site,
              "image": "", "value": "0.5"} for m in ("centralized", "fedsm") for s in (0, 1)
             for site in ("site-1", "site-2")]

    text = study_table([*tests, *HAND], 100)

    assert text.index("| Centralized |") < text.index("| method | per seed | mean |")
    assert "| FedSM | -5.00 / +20.00 | +7.50 |" in text
