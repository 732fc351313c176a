"""Gamma calibration on simulated unseen sites, and temperature scaling of the selector."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.analysis.gamma_calibration import (
    TEMPERATURE_GRID,
    calibrate_gamma,
    drop_site,
    fit_temperature,
    fit_unseen_temperature,
    negative_log_likelihood,
    unseen_site_curves,
    unseen_site_labelled_logits,
)
from fedsm_core.analysis.model_scores import ModelScores, softmax

SITES = ("a", "b", "c")


def scores(probs, dice, name: str) -> ModelScores:
    """ModelScores whose selector logits are log(probs), so softmax(logits) == probs."""
    probs = np.asarray(probs, dtype=np.float64)
    ids = tuple(f"{name}/{i}" for i in range(len(probs)))
    return ModelScores(np.asarray(dice, dtype=np.float64), np.log(probs), np.zeros((len(probs), 2), np.float32), ids)


def validation_case() -> dict[str, ModelScores]:
    """Three training sites a, b, c; validation images of a (2) and b (1).

    With its own site dropped:
    * a/0 -> b with confidence 0.39 / 0.50 = 0.78; Dice global 0.5, routed (b) 0.8
    * a/1 -> c with confidence 0.31 / 0.50 = 0.62; Dice global 0.7, routed (c) 0.3
    * b/0 -> a with confidence 0.204 / 0.300 = 0.68; Dice global 0.4, routed (a) 0.9
    Dice columns: [global, a, b, c].
    """
    return {
        "a": scores([[0.50, 0.39, 0.11], [0.50, 0.19, 0.31]],
                    [[0.5, 0.9, 0.8, 0.1], [0.7, 0.9, 0.2, 0.3]], "a"),
        "b": scores([[0.204, 0.70, 0.096]], [[0.4, 0.9, 0.95, 0.1]], "b"),
    }


# ---------------------------------------------------------------- drop_site

def test_drop_site_zeroes_the_column_and_renormalises():
    probs = np.array([[0.2, 0.3, 0.5],
                      [0.6, 0.1, 0.3],
                      [1.0, 0.0, 0.0]])   # all mass on the dropped site
    before = probs.copy()

    out = drop_site(probs, 0)

    np.testing.assert_allclose(out, [[0.0, 0.375, 0.625],
                                     [0.0, 0.25, 0.75],
                                     [0.0, 0.5, 0.5]], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(probs, before)  # input untouched
    assert out.shape == probs.shape


def test_drop_site_in_the_middle_keeps_site_indices():
    out = drop_site(np.array([[0.1, 0.8, 0.1, 0.0], [0.0, 1.0, 0.0, 0.0]]), 1)

    np.testing.assert_allclose(out, [[0.5, 0.0, 0.5, 0.0], [1 / 3, 0.0, 1 / 3, 1 / 3]], rtol=0, atol=1e-12)


def test_drop_site_needs_two_sites():
    with pytest.raises(ValueError, match="two or more sites"):
        drop_site(np.ones((2, 1)), 0)


# ---------------------------------------------------------------- calibration

def test_unseen_site_curves_route_without_the_own_site():
    curves = unseen_site_curves(validation_case(), SITES)

    # a: routed (0.8 + 0.3) / 2 while gamma < 0.62, then a/1 global (0.8 + 0.7) / 2 while < 0.78, then (0.5 + 0.7) / 2
    # b: 0.9 while gamma < 0.68, then 0.4
    expected_a = [0.55 if g < 0.62 else 0.75 if g < 0.78 else 0.6 for g in GAMMA_GRID]
    expected_b = [0.9 if g < 0.68 else 0.4 for g in GAMMA_GRID]
    assert set(curves) == {"a", "b"}
    assert curves["a"] == pytest.approx(expected_a, abs=1e-12)
    assert curves["b"] == pytest.approx(expected_b, abs=1e-12)


def test_calibrate_gamma_pools_by_image_count_and_picks_the_maximum():
    gamma, pooled = calibrate_gamma(validation_case(), SITES)

    # weights 2 (a) and 1 (b):
    #   gamma <= 0.60: (2 * 0.55 + 0.9) / 3 = 2.0 / 3;   0.65: (2 * 0.75 + 0.9) / 3 = 0.8
    #   0.70, 0.75:    (2 * 0.75 + 0.4) / 3 = 1.9 / 3;   >= 0.80: (2 * 0.6 + 0.4) / 3 = 1.6 / 3
    expected = [2.0 / 3 if g <= 0.6 else 0.8 if g == 0.65 else 1.9 / 3 if g <= 0.75 else 1.6 / 3 for g in GAMMA_GRID]
    assert pooled == pytest.approx(expected, abs=1e-12)
    assert gamma == 0.65


def test_calibrate_gamma_ties_go_to_the_smallest_gamma():
    # site a alone: 0.75 on the plateau 0.65, 0.70, 0.75
    gamma, pooled = calibrate_gamma({"a": validation_case()["a"]}, SITES)

    assert [g for g, v in zip(GAMMA_GRID, pooled, strict=True) if v == max(pooled)] == [0.65, 0.7, 0.75]
    assert gamma == 0.65


def test_calibration_applies_the_temperature():
    # b/0 at T = 2: probabilities ~ sqrt(p), so its confidence without b is
    # sqrt(0.204) / (sqrt(0.204) + sqrt(0.096)) = 0.5931: the curve drops between 0.55 and 0.60
    confidence = math.sqrt(0.204) / (math.sqrt(0.204) + math.sqrt(0.096))
    assert 0.55 < confidence < 0.6

    curves = unseen_site_curves({"b": validation_case()["b"]}, SITES, temperature=2.0)

    assert curves["b"] == pytest.approx([0.9 if g < confidence else 0.4 for g in GAMMA_GRID], abs=1e-12)


def test_calibration_rejects_scores_of_a_site_the_selector_does_not_know():
    with pytest.raises(ValueError, match="'z', which is not a selector site"):
        unseen_site_curves({"z": validation_case()["b"]}, SITES)


# ---------------------------------------------------------------- temperature scaling

def test_negative_log_likelihood_hand_values():
    logits = np.array([[0.0, math.log(3.0)], [0.0, 0.0]])  # probabilities [1/4, 3/4] and [1/2, 1/2]

    nll = negative_log_likelihood(logits, np.array([1, 0]), 1.0)

    assert nll == pytest.approx(-(math.log(0.75) + math.log(0.5)) / 2, abs=1e-12)
    # at T = 2, logits [0, 2 ln 3] give [1/4, 3/4]: label 0 costs ln 4
    assert negative_log_likelihood(np.array([[0.0, 2 * math.log(3.0)]]), np.array([0]), 2.0) == pytest.approx(
        math.log(4.0), abs=1e-12)


def calibrated_case(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Logits ``scale * base`` with label counts equal to ``softmax(base)``, so NLL is least at T = scale.

    base [0, -ln 3] has probabilities [3/4, 1/4]: labels 0, 0, 0, 1;
    base [-ln 9, 0] has probabilities [1/10, 9/10]: labels 0 once and 1 nine times.
    """
    first = np.tile([0.0, -math.log(3.0)], (4, 1))
    second = np.tile([-math.log(9.0), 0.0], (10, 1))
    labels = np.array([0, 0, 0, 1] + [0] + [1] * 9)
    return scale * np.concatenate([first, second]), labels


def test_fit_temperature_recovers_the_scale_of_overconfident_logits():
    scale = TEMPERATURE_GRID[70]  # 10 ** (-3 + 70 * 0.05) = 10 ** 0.5 = 3.1623, an overconfident selector
    logits, labels = calibrated_case(scale)

    assert fit_temperature(logits, labels) == scale
    assert fit_temperature(logits, labels, grid=[1.0, 2.0, 3.0, 4.0, 5.0]) == 3.0


def test_fit_temperature_sharpens_an_underconfident_selector():
    logits, labels = calibrated_case(0.5)

    assert fit_temperature(logits, labels, grid=[0.25, 0.5, 1.0, 2.0]) == 0.5


def test_fit_temperature_matches_the_closed_form_of_a_two_class_case():
    # Every image has logits (d, 0) and 80 % are labelled class 0. The NLL
    # -0.8 log s(d / T) - 0.2 log s(-d / T) is least where s(d / T) = 0.8, i.e.
    # d / T = ln(0.8 / 0.2) = ln 4; with d = 3 ln 4 that is T = 3 exactly.
    d = 3.0 * math.log(4.0)
    logits = np.tile([d, 0.0], (10, 1))
    labels = np.array([0] * 8 + [1] * 2)

    best = fit_temperature(logits, labels, grid=[1.0, 2.0, 2.5, 3.0, 3.5, 4.0, 6.0])

    assert best == 3.0
    assert negative_log_likelihood(logits, labels, 3.0) == pytest.approx(
        -(0.8 * math.log(0.8) + 0.2 * math.log(0.2)), abs=1e-12)


def test_fit_temperature_needs_labels():
    with pytest.raises(ValueError, match="at least one labelled image"):
        fit_temperature(np.zeros((0, 2)), np.zeros(0, dtype=int))


def test_unseen_site_labels_are_the_best_other_personalized_model_and_the_own_output_is_removed():
    val = {"b": validation_case()["b"], "a": validation_case()["a"]}  # mapping order differs from site order

    logits, labels = unseen_site_labelled_logits(val, SITES)

    # b/0: Dice of a 0.9, c 0.1 (b's own 0.95 excluded) -> a; a/0: b 0.8 > c 0.1 -> b; a/1: c 0.3 > b 0.2 -> c
    np.testing.assert_array_equal(labels, [0, 1, 2])
    # with the own output removed, the softmax is drop_site's renormalisation
    np.testing.assert_allclose(softmax(logits), [[0.204 / 0.3, 0.0, 0.096 / 0.3], [0.0, 0.78, 0.22],
                                                 [0.0, 0.38, 0.62]], rtol=0, atol=1e-12)


def _unseen_case(scale: float) -> dict[str, ModelScores]:
    """Validation of sites a and b whose left-out logits are ``scale`` times calibrated ones.

    Left-out probabilities of each image [3/4, 1/4] between the two other sites, and the best
    other model is the likelier one for 3 of 4 images: at T = scale the NLL is least.
    """
    def site(own: int, name: str) -> ModelScores:
        others = [k for k in range(3) if k != own]
        logits = np.zeros((4, 3))
        logits[:, others[0]], logits[:, others[1]] = 0.0, -math.log(3.0)
        logits[:, own] = 5.0  # the own site's output: removed before the fit, so any value
        dice = np.zeros((4, 4))
        dice[:, 1 + others[0]] = [0.9, 0.9, 0.9, 0.2]
        dice[:, 1 + others[1]] = [0.5, 0.5, 0.5, 0.8]
        return ModelScores(dice, scale * logits, np.zeros((4, 2), np.float32), tuple(f"{name}/{i}" for i in range(4)))

    return {"a": site(0, "a"), "b": site(1, "b")}


@pytest.mark.parametrize("scale", [TEMPERATURE_GRID[100], TEMPERATURE_GRID[20]])  # 10^2 over-, 10^-2 under-confident
def test_unseen_temperature_softens_an_overconfident_and_sharpens_an_underconfident_selector(scale):
    fitted = fit_unseen_temperature(_unseen_case(scale), SITES)

    assert fitted == scale
    assert TEMPERATURE_GRID[0] < fitted < TEMPERATURE_GRID[-1]  # an answer inside the grid, not its floor or ceiling


def test_calibration_never_picks_a_gamma_that_costs_a_left_out_site_more_than_the_tolerance():
    # Left out, a's image goes to c at confidence 0.95 and loses 0.1 (0.6 against the global 0.7); b's three
    # images go to a at confidence 0.6 and gain 0.5 each (0.9 against 0.4). Pooled over 4 images:
    #   gamma < 0.60: (0.6 + 3 * 0.9) / 4 = 0.825   (a loses 0.1: unsafe)
    #   0.60 - 0.90:  (0.6 + 3 * 0.4) / 4 = 0.45    (a loses 0.1: unsafe)
    #   >= 0.95:      (0.7 + 3 * 0.4) / 4 = 0.475   (nothing routed: safe)
    case = {
        "a": scores([[0.5, 0.025, 0.475]], [[0.7, 0.9, 0.2, 0.6]], "a"),
        "b": scores([[0.3, 0.5, 0.2]] * 3, [[0.4, 0.9, 0.95, 0.1]] * 3, "b"),
    }

    safe, pooled = calibrate_gamma(case, SITES)
    lenient, _ = calibrate_gamma(case, SITES, tolerance=0.2)

    assert pooled[0] == pytest.approx(0.825) and pooled[GAMMA_GRID.index(0.95)] == pytest.approx(0.475)
    assert lenient == 0.0  # a's loss of 0.1 is within 0.2: the pooled optimum
    assert safe == 0.95  # the smallest gamma that routes none of a's images


def test_calibration_needs_the_everything_global_gamma():
    with pytest.raises(ValueError, match="gamma = 1"):
        calibrate_gamma(validation_case(), SITES, gammas=(0.0, 0.5))
