"""Super-model evaluation: sweeps that restate the super model's Dice at any gamma, routing and scores per case."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.tiny_super_model import ChannelSelector, Threshold, tiny_site

from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.algorithms.fedsm.super_model import SuperModel
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.case_scores import case_metrics
from fedsm_core.evaluation.super_model_evaluation import evaluate_model, evaluate_super_model


@pytest.mark.parametrize("gammas", [(0.0, 0.0, 0.0), (0.6, 1.0, 0.3), (1.0, 0.45, 0.9)])
def test_dice_at_a_gamma_per_model_equals_global_dice_plus_the_swept_gains(gammas):
    # Prepare: global model slightly off, personalized models better (0), worse (1) and far off (2)
    personalized = [Threshold(0.5), Threshold(0.7), Threshold(0.2)]
    model = SuperModel(Threshold(0.55), personalized, ChannelSelector(3), 0.5)
    data = tiny_site(0)

    # Execute: one validation pass with the sweeps, and one evaluation at the per-model gammas
    swept = evaluate_super_model(model, 0, data, batch_size=5, gammas=GAMMA_GRID)
    model.gamma = gammas
    direct = evaluate_super_model(model, 0, data, batch_size=5)

    # Assert: Dice_super = Dice_global + sum_m gain[m, g_m] / n, and the share routed to global likewise
    size = len(GAMMA_GRID)
    gains = np.reshape(swept["routing-gain-sweep"], (3, size))
    counts = np.reshape(swept["routed-count-sweep"], (3, size))
    index = [GAMMA_GRID.index(g) for g in gammas]
    n = swept["num-images"]
    restated = swept["dice-global"] + sum(gains[m, i] for m, i in enumerate(index)) / n
    assert restated == pytest.approx(direct["dice-super"], abs=1e-9)
    assert 1 - sum(counts[m, i] for m, i in enumerate(index)) / n == pytest.approx(direct["share-global"])
    assert direct["gamma"] == gammas[0]  # the threshold of site 0's own model


def test_one_gamma_for_all_models_is_the_scalar_sweep():
    model = SuperModel(Threshold(0.55), [Threshold(0.5), Threshold(0.7), Threshold(0.2)], ChannelSelector(3), 0.5)
    swept = evaluate_super_model(model, 1, tiny_site(1), gammas=GAMMA_GRID)
    gains = np.reshape(swept["routing-gain-sweep"], (3, len(GAMMA_GRID))).sum(axis=0)

    np.testing.assert_allclose(swept["dice-global"] + gains / swept["num-images"], swept["dice-super-sweep"],
                               atol=1e-9)


def _two_cases() -> tuple[SegArrays, np.ndarray]:
    """Six slices of two cases whose selector probabilities (K = 2) are those of tests/.../test_case_routing.py."""
    probs = np.array([[0.9, 0.1], [0.3, 0.7], [0.4, 0.6], [0.55, 0.45], [0.58, 0.42], [0.9, 0.1]])
    data = tiny_site(4, n=6)
    data.images[:, 0, 0, :2] = np.log(probs) / 10  # ChannelSelector: logits = 10 * those pixels
    ids = tuple(f"s/{case}/z{z:03d}" for case in "AB" for z in range(3))
    return SegArrays(data.images, data.masks, ids), data.images[:, 1:2]


def test_route_by_case_routes_each_case_once_and_reports_case_scores():
    # Prepare: gamma 0.6; alone the slices go to 0, 1, global, global, global, 0; per case A -> global
    # (confidence 0.578) and B -> site 0 (0.712)
    data, channel = _two_cases()
    model = SuperModel(Threshold(0.55), [Threshold(0.5), Threshold(0.7)], ChannelSelector(2), 0.6)

    # Execute
    per_image = evaluate_super_model(model, 0, data, batch_size=4, routing=True)
    per_case = evaluate_super_model(model, 0, data, batch_size=4, routing=True, route_by="case")

    # Assert: the routes, and the case scores of the masks those routes give
    assert (per_image["num-routed-0"], per_image["num-routed-1"], per_image["num-routed-global"]) == (2, 1, 3)
    assert (per_case["num-routed-0"], per_case["num-routed-global"]) == (3, 3) and "num-routed-1" not in per_case
    super_masks = np.concatenate([channel[:3] > 0.55, channel[3:] > 0.5])  # A: global, B: site 0's model
    expected = case_metrics({"global": channel > 0.55, "personal": channel > 0.5, "super": super_masks},
                            data.masks, data.ids)
    assert expected["num-cases"] == 2
    assert {key: per_case[key] for key in expected} == pytest.approx(expected)
    assert per_case["case-dice-global"] == per_image["case-dice-global"]


def test_with_a_sweep_the_super_models_case_scores_wait_for_the_chosen_gamma():
    data, _ = _two_cases()
    model = SuperModel(Threshold(0.55), [Threshold(0.5), Threshold(0.7)], ChannelSelector(2), 0.6)
    swept = evaluate_super_model(model, 0, data, batch_size=4, gammas=GAMMA_GRID, route_by="case")
    assert "case-dice-global" in swept and "case-dice-personal" in swept and "case-dice-super" not in swept


def test_images_without_cases_report_no_case_metrics_and_route_alike_either_way():
    model = SuperModel(Threshold(0.55), [Threshold(0.5), Threshold(0.7), Threshold(0.2)], ChannelSelector(3), 0.5)
    data = tiny_site(2)  # ids "s2/0", ...: no case
    by_image = evaluate_super_model(model, 2, data, routing=True)
    by_case = evaluate_super_model(model, 2, data, routing=True, route_by="case")
    assert by_case == by_image
    assert not [key for key in by_image if key.startswith("case-") or key.endswith("-cases")]
    assert "num-cases" not in evaluate_model(Threshold(0.55), data)


def test_one_models_evaluation_reports_its_case_scores_under_its_name():
    data, channel = _two_cases()
    metrics = evaluate_model(Threshold(0.55), data, batch_size=4, name="dice-global")
    assert metrics["case-dice-global"] == pytest.approx(
        case_metrics({"global": channel > 0.55}, data.masks, data.ids)["case-dice-global"])
    assert metrics["num-cases"] == 2


def test_a_split_whose_cases_carry_spacings_also_reports_hd95_in_mm():
    # Prepare: the same two cases, with 3 mm slices and 0.5 mm pixels
    data, channel = _two_cases()
    cases = {"/".join(i.split("/")[:2]) for i in data.ids}
    spaced = dataclasses.replace(data, spacings={case: (3.0, 0.5, 0.5) for case in cases})

    # Execute
    plain = evaluate_model(Threshold(0.55), data, batch_size=4)
    metrics = evaluate_model(Threshold(0.55), spaced, batch_size=4)

    # Assert: the mm value is the case scores' with that spacing; without spacings there is none
    expected = case_metrics({"global": channel > 0.55}, data.masks, data.ids, spaced.spacings)
    assert "case-hd95-mm-global" not in plain
    assert metrics["case-hd95-mm-global"] == pytest.approx(expected["case-hd95-mm-global"])
    assert metrics["case-hd95-global"] == pytest.approx(plain["case-hd95-global"])

