"""Cross-fitted validation of fine-tuned models: halves by case, merging halves, which model scores which half."""

from __future__ import annotations

import numpy as np
import pytest
from support.tiny_super_model import ChannelSelector, Threshold, tiny_site

from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.algorithms.fedsm.super_model import SuperModel
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.cross_fit import (
    can_cross_fit,
    cross_fitted_metrics,
    fingerprint,
    halve_by_case,
    merge_halves,
    with_cross_fitted_sweeps,
)
from fedsm_core.evaluation.super_model_evaluation import evaluate_super_model

GAMMAS = list(GAMMA_GRID)


def _split(ids: list[str]) -> SegArrays:
    count = len(ids)
    return SegArrays(np.zeros((count, 1, 4, 4), np.float32), np.zeros((count, 1, 4, 4), np.float32), tuple(ids))


def test_halves_keep_the_slices_of_a_case_together_and_alternate_cases():
    # Arrange: three cases of two, three and one slices, listed out of order, and one image without a case
    data = _split(["s/a/z0", "s/b/z0", "s/a/z1", "s/c/z4", "s/b/z1", "s/b/z2", "s/0007"])

    # Execute
    first, second = halve_by_case(data)

    # Assert: cases numbered by first appearance (a 0, b 1, c 2, the loose image 3); no case is cut in two
    assert first.ids == ("s/a/z0", "s/a/z1", "s/c/z4")
    assert second.ids == ("s/b/z0", "s/b/z1", "s/b/z2", "s/0007")


def test_halves_without_cases_are_the_even_and_odd_images_and_one_image_cannot_be_cross_fitted():
    first, second = halve_by_case(_split([f"site-1/{i:04d}" for i in range(5)]))
    assert first.ids == ("site-1/0000", "site-1/0002", "site-1/0004")
    assert second.ids == ("site-1/0001", "site-1/0003")
    assert can_cross_fit(_split(["a/0", "a/1"])) and not can_cross_fit(_split(["a/0"]))
    assert not can_cross_fit(_split(["s/a/z0", "s/a/z1"]))  # one case: its slices stay together


def test_merging_two_halves_weights_dice_by_images_with_foreground_and_adds_counts():
    # first half: 4 images, 1 empty (3 with foreground); second: 2 images, 1 empty (1 with foreground)
    first = {"dice-super-sweep": [0.8, 0.6], "num-images": 4.0, "num-empty": 1.0,
             "routing-gain-sweep": [0.5, -0.25], "routed-count-sweep": [3.0, 1.0]}
    second = {"dice-super-sweep": [0.5, 0.9], "num-images": 2.0, "num-empty": 1.0,
              "routing-gain-sweep": [0.125, 0.0], "routed-count-sweep": [1.0, 0.0]}

    merged = merge_halves(first, second)

    # (3 * 0.8 + 1 * 0.5) / 4 = 0.725; (3 * 0.6 + 1 * 0.9) / 4 = 0.675
    assert merged["dice-super-sweep"] == pytest.approx([0.725, 0.675], abs=1e-12)
    assert merged["num-images"] == 6.0 and merged["num-empty"] == 2.0
    assert merged["routing-gain-sweep"] == pytest.approx([0.625, -0.25], abs=1e-12)
    assert merged["routed-count-sweep"] == [4.0, 1.0]
    empty = {"dice-super-sweep": [0.0], "num-images": 2.0, "num-empty": 2.0}
    assert merge_halves(empty, empty)["dice-super-sweep"] == [0.0]  # no foreground: 0, not NaN


def _model(own: Threshold) -> SuperModel:
    # site 0's personalized model is ``own``; site 1's a perfect one; the global model a mediocre one
    return SuperModel(Threshold(0.6), [own, Threshold(0.5)], ChannelSelector(2), 0.5)


def test_each_half_is_scored_with_the_model_the_other_half_chose_and_the_deployed_model_stays():
    # Arrange: site 0 deploys a model with threshold 0.5 (perfect); the pass chosen on half 0 is a poor model
    # (0.8), the one chosen on half 1 a fair one (0.55)
    val = tiny_site(0, 10)
    deployed = Threshold(0.5)
    model = _model(deployed)
    chosen_on_half = [Threshold(0.8), Threshold(0.55)]

    # Execute
    crossed = cross_fitted_metrics(model, 0, val, chosen_on_half, 4, "cpu", GAMMAS, "image")

    # Assert: half 0 scored with half 1's model, half 1 with half 0's, merged by images with foreground
    first, second = halve_by_case(val)
    expected = merge_halves(
        evaluate_super_model(_model(Threshold(0.55)), 0, first, 4, "cpu", GAMMAS),
        evaluate_super_model(_model(Threshold(0.8)), 0, second, 4, "cpu", GAMMAS))
    assert crossed["dice-super-sweep"] == pytest.approx(expected["dice-super-sweep"], abs=1e-12)
    assert crossed["routing-gain-sweep"] == pytest.approx(expected["routing-gain-sweep"], abs=1e-9)
    assert model.personalized[0] is deployed
    # gamma 1 sends every image to the global model, which cross-fitting leaves alone
    whole = evaluate_super_model(model, 0, val, 4, "cpu", GAMMAS)
    assert crossed["dice-super-sweep"][-1] == pytest.approx(whole["dice-super-sweep"][-1], abs=1e-12)
    assert crossed["dice-super-sweep"][0] < whole["dice-super-sweep"][0]  # the deployed model was flattered


def test_cross_fitting_with_the_deployed_model_on_both_halves_is_the_plain_sweep():
    val = tiny_site(1, 9)
    model = _model(Threshold(0.45))
    whole = evaluate_super_model(model, 0, val, 4, "cpu", GAMMAS)

    crossed = with_cross_fitted_sweeps(whole, model, 0, val, [Threshold(0.45), Threshold(0.45)], 4, "cpu", GAMMAS)

    for key in ("dice-super-sweep", "routing-gain-sweep", "routed-count-sweep"):
        assert crossed[key] == pytest.approx(whole[key], abs=1e-9), key
    assert crossed["dice-global"] == whole["dice-global"] and crossed["num-images"] == whole["num-images"]


def test_a_fingerprint_names_the_exact_weights():
    weights = {"b": np.zeros(3, np.float32), "a": np.ones((2, 2), np.float32)}
    assert fingerprint(weights) == fingerprint(dict(reversed(list(weights.items()))))
    changed = {**weights, "b": np.array([0, 0, 1e-7], np.float32)}
    assert fingerprint(changed) != fingerprint(weights)
    assert fingerprint({**weights, "b": weights["b"].astype(np.float64)}) != fingerprint(weights)
