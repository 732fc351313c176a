"""Held-out-site analysis on hand-made per-image scores."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.analysis.familiarity import SiteRegions
from fedsm_core.analysis.gamma_calibration import TEMPERATURE_GRID
from fedsm_core.analysis.held_out import analyse_held_out, project_2d
from fedsm_core.analysis.model_scores import ModelScores

SITES = ("a", "b", "c")


def scores(probs, dice, name: str) -> ModelScores:
    """ModelScores whose selector logits are log(probs), so softmax(logits) == probs."""
    probs = np.asarray(probs, dtype=np.float64)
    ids = tuple(f"{name}/{i}" for i in range(len(probs)))
    features = np.arange(len(probs) * 2, dtype=np.float32).reshape(len(probs), 2)
    return ModelScores(np.asarray(dice, dtype=np.float64), np.log(probs), features, ids)


# Held-out site "d": four test images. Confidence (routed site) and Dice [global, a, b, c]:
#   d/0: 0.92 (a)  [0.5, 0.9, 0.1, 0.2]   the personalized model is better
#   d/1: 0.72 (b)  [0.6, 0.2, 0.3, 0.1]   the global model is better
#   d/2: 0.57 (a)  [0.7, 0.1, 0.2, 0.3]   the global model is better
#   d/3: 0.62 (c)  [0.4, 0.8, 0.3, 0.5]   the routed model is better
# Routed Dice sum: gamma <= 0.55: 0.9 + 0.3 + 0.1 + 0.5 = 1.8;  0.60: d/2 global, 2.4;
# 0.65-0.70: d/2, d/3 global, 2.3;  0.75-0.90: only d/0 routed, 2.6;  >= 0.95: all global, 2.2.
TEST = scores([[0.92, 0.05, 0.03], [0.18, 0.72, 0.10], [0.57, 0.23, 0.20], [0.18, 0.20, 0.62]],
              [[0.5, 0.9, 0.1, 0.2], [0.6, 0.2, 0.3, 0.1], [0.7, 0.1, 0.2, 0.3], [0.4, 0.8, 0.3, 0.5]], "d")
EXPECTED_CURVE = [(1.8 if g <= 0.55 else 2.4 if g <= 0.6 else 2.3 if g <= 0.7 else 2.6 if g <= 0.9 else 2.2) / 4
                  for g in GAMMA_GRID]

# Validation of training sites a (2 images) and b (1 image), see test_gamma_calibration:
# the pooled unseen-site curve peaks at gamma 0.65.
VAL = {
    "a": scores([[0.50, 0.39, 0.11], [0.50, 0.19, 0.31]], [[0.5, 0.9, 0.8, 0.1], [0.7, 0.9, 0.2, 0.3]], "a"),
    "b": scores([[0.204, 0.70, 0.096]], [[0.4, 0.9, 0.95, 0.1]], "b"),
}


@pytest.fixture(scope="module")
def result():
    return analyse_held_out("d", TEST, VAL, SITES, bundle_gamma=0.6, temperature_scaling=False)


def test_test_curve_and_the_four_gammas(result):
    assert result.site == "d" and result.num_images == 4
    assert result.gamma_grid == GAMMA_GRID
    assert result.curve == pytest.approx(EXPECTED_CURVE, abs=1e-12)
    assert result.gammas == {"zero": 0.0, "bundle": 0.6, "calibrated": 0.65, "oracle": 0.75}
    assert result.temperature == 1.0  # temperature_scaling=False
    # the oracle is the best gamma of the test curve (smallest of the 0.75-0.90 plateau)
    best = max(result.curve)
    assert result.curve[GAMMA_GRID.index(result.gammas["oracle"])] == best
    assert all(value < best for g, value in zip(GAMMA_GRID, result.curve, strict=True) if g < result.gammas["oracle"])


def test_routing_frequencies_by_hand(result):
    assert result.frequencies["zero"] == pytest.approx({"global": 0.0, "a": 0.5, "b": 0.25, "c": 0.25})
    assert result.frequencies["bundle"] == pytest.approx({"global": 0.25, "a": 0.25, "b": 0.25, "c": 0.25})
    assert result.frequencies["calibrated"] == pytest.approx({"global": 0.5, "a": 0.25, "b": 0.25, "c": 0.0})
    assert result.frequencies["oracle"] == pytest.approx({"global": 0.75, "a": 0.25, "b": 0.0, "c": 0.0})
    for shares in result.frequencies.values():
        assert list(shares) == ["global", *SITES]
        assert sum(shares.values()) == pytest.approx(1.0)


def test_dice_of_every_model_and_of_the_super_model(result):
    assert result.dice == pytest.approx({
        "global": 2.2 / 4, "a": 2.0 / 4, "b": 0.9 / 4, "c": 1.1 / 4,
        "super@zero": 1.8 / 4, "super@bundle": 2.4 / 4, "super@calibrated": 2.3 / 4, "super@oracle": 2.6 / 4,
    }, abs=1e-12)
    assert result.dice["super@oracle"] >= result.dice["super@zero"]
    assert result.dice["super@oracle"] == max(result.curve)
    # the pooled validation curve of the calibration is kept
    assert result.calibration_curve[GAMMA_GRID.index(0.65)] == pytest.approx(0.8)


def test_temperature_scaling_fits_t_on_validation_and_leaves_the_test_curve_alone():
    # With its own site left out, every validation image's likeliest remaining site is also the one whose
    # model segments it best (a/0 -> b, a/1 -> c, b/0 -> a), so the NLL falls as T falls: the smallest
    # temperature of the grid. Sharpened, every validation image is routed below gamma 0.95, and a/1's route
    # to c (Dice 0.3 against the global model's 0.7) costs left-out site a 0.05 > 0.003: unsafe. From 0.95 on
    # nothing is routed, so the calibrated gamma is 1 at the latest: every held-out test image stays global.
    scaled = analyse_held_out("d", TEST, VAL, SITES, bundle_gamma=0.6, temperature_scaling=True)

    assert scaled.temperature == pytest.approx(TEMPERATURE_GRID[0])
    assert scaled.curve == pytest.approx(EXPECTED_CURVE, abs=1e-12)  # oracle and test curve use T = 1
    assert scaled.gammas["oracle"] == 0.75
    assert scaled.frequencies["calibrated"] == pytest.approx({"global": 1.0, "a": 0.0, "b": 0.0, "c": 0.0})
    assert scaled.dice["super@calibrated"] == pytest.approx(scaled.dice["global"], abs=1e-12)


def test_a_custom_gamma_grid_is_used_throughout():
    grid = (0.0, 0.8, 1.0)

    custom = analyse_held_out("d", TEST, VAL, SITES, 0.0, temperature_scaling=False, gamma_grid=grid)

    assert custom.gamma_grid == grid
    assert custom.curve == pytest.approx([1.8 / 4, 2.6 / 4, 2.2 / 4], abs=1e-12)
    assert len(custom.calibration_curve) == 3
    assert custom.gammas["oracle"] == 0.8


# ---------------------------------------------------------------- project_2d

def test_project_2d_separates_two_clusters_along_the_first_axis():
    rng = np.random.default_rng(0)
    centre = np.array([4.0, -3.0, 5.0, 0.0, 0.0])
    left = centre + rng.normal(scale=0.3, size=(10, 5))
    right = -centre + rng.normal(scale=0.3, size=(12, 5))

    points = project_2d(np.concatenate([left, right]).astype(np.float32))

    assert points.shape == (22, 2)
    first = points[:, 0]
    assert (np.all(first[:10] > 0) and np.all(first[10:] < 0)) or (np.all(first[:10] < 0) and np.all(first[10:] > 0))
    assert abs(first[:10].mean() - first[10:].mean()) > 5 * max(first[:10].std(), first[10:].std())


def test_project_2d_standardises_so_a_loud_unrelated_feature_does_not_dominate():
    # Three features carry the cluster (std ~1), a fourth is pure noise with std 1000:
    # without standardisation the first axis would follow the noise.
    rng = np.random.default_rng(1)
    labels = np.repeat([1.0, -1.0], 15)
    signal = labels[:, None] + rng.normal(scale=0.1, size=(30, 3))
    noise = rng.normal(scale=1000.0, size=(30, 1))

    first = project_2d(np.concatenate([signal, noise], axis=1))[:, 0]

    assert np.all(np.sign(first[:15]) == np.sign(first[0])) and np.all(np.sign(first[15:]) == -np.sign(first[0]))


def test_project_2d_of_a_constant_feature_is_finite():
    features = np.array([[1.0, 5.0, 0.0], [2.0, 5.0, 1.0], [3.0, 5.0, 0.0]])

    points = project_2d(features)

    assert points.shape == (3, 2) and np.all(np.isfinite(points))


def test_with_site_regions_unfamiliar_test_images_go_to_the_global_model():
    # TEST's features (0..7) lie far from every site mean (100, 200, 300): the calibrated routes are all global,
    # while the other gammas still follow the selector alone.
    regions = SiteRegions(np.array([[100.0, 100.0], [200.0, 200.0], [300.0, 300.0]]), np.eye(2), 10.0)

    gated = analyse_held_out("d", TEST, VAL, SITES, bundle_gamma=0.6, temperature_scaling=False, regions=regions)

    assert gated.frequencies["calibrated"]["global"] == 1.0
    assert gated.dice["super@calibrated"] == pytest.approx(gated.dice["global"], abs=1e-12)
    assert gated.frequencies["zero"] == pytest.approx({"global": 0.0, "a": 0.5, "b": 0.25, "c": 0.25})


def test_the_local_gamma_is_the_best_on_the_sites_own_validation_images():
    # The site's validation images here are its test images, so the local choice is the oracle's: 0.75
    # (the smallest of the 0.75-0.90 plateau), Dice 2.6 / 4; a second site_val that only loses by routing
    # (routed models all worse than the global model) keeps everything global: from gamma 0.9 on neither of
    # its images (confidence 0.9 and 0.8) is routed, and ties go to the smallest gamma.
    local = analyse_held_out("d", TEST, VAL, SITES, 0.6, temperature_scaling=False, site_val=TEST)
    losing = scores([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1]], [[0.9, 0.1, 0.1, 0.1], [0.8, 0.2, 0.2, 0.2]], "d-val")
    cautious = analyse_held_out("d", TEST, VAL, SITES, 0.6, temperature_scaling=False, site_val=losing)

    assert local.gammas["local"] == 0.75 and local.dice["super@local"] == pytest.approx(2.6 / 4, abs=1e-12)
    # on test, gamma 0.9 still routes d/0 (confidence 0.92) to a: 0.9 instead of 0.5
    assert cautious.gammas["local"] == 0.9 and cautious.dice["super@local"] == pytest.approx(2.6 / 4, abs=1e-12)
    assert "local" not in analyse_held_out("d", TEST, VAL, SITES, 0.6, temperature_scaling=False).gammas
