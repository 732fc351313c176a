"""kNN-Per's site evaluation: its per-case scores reduce to the scored model's where lam = 0, and match
case_metrics of kNN-Per's own masks where it mixes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from support.tiny_super_model import BrightnessSelector, PixelHead

from fedsm_core.algorithms.fedsm.super_model import SuperModel
from fedsm_core.algorithms.knn_per.knn_per import KNNPer, mix_probabilities
from fedsm_core.algorithms.knn_per.settings import KNNPerSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.case_scores import case_metrics
from fedsm_core.evaluation.knn_per_evaluation import evaluate_knn_per_at_site
from fedsm_core.evaluation.super_model_evaluation import evaluate_model, evaluate_super_model

SETTINGS = KNNPerSettings(k=3, capacity=2_000, pixels_per_image=8, backend="torch")
CASE_KEYS = ("case-dice-", "case-hd95-", "case-hd95-mm-", "num-missed-cases-")


def _cases(count: int, seed: int, spacing: bool = True) -> SegArrays:
    """Slices of two cases (``"s/A/z000"``...) with a square gland that grows towards the middle slices."""
    rng = np.random.default_rng(seed)
    images = rng.random((count, 3, 8, 8)) * rng.random((count, 1, 1, 1)) * 2.0
    masks = np.zeros((count, 1, 8, 8), np.float32)
    half = count // 2
    for index in range(count):
        width = 1 + min(index % half, half - 1 - index % half)
        masks[index, 0, 4 - width : 4 + width, 4 - width : 4 + width] = 1.0
    ids = tuple(f"s/{'AB'[index // half]}/z{index % half:03d}" for index in range(count))
    spacings = {"s/A": (2.0, 0.5, 0.5), "s/B": (2.0, 0.5, 0.5)} if spacing else {}
    return SegArrays(images, masks, ids, spacings)


def _case_scores(metrics: dict[str, float], model: str) -> dict[str, float]:
    return {prefix: metrics[prefix + model] for prefix in CASE_KEYS if prefix + model in metrics}


def test_at_lambda_zero_knn_per_scores_each_case_as_the_global_model_does():
    # Prepare: lam may only be 0, so kNN-Per's masks are the global model's
    model = PixelHead(0)
    train, val, test = _cases(8, seed=0), _cases(6, seed=1), _cases(10, seed=2)
    settings = dataclasses.replace(SETTINGS, lambda_grid=(0.0,))

    # Execute
    scores = evaluate_knn_per_at_site(model, train, val, test, settings, "cpu")
    expected = evaluate_model(model, test)

    # Assert
    assert set(_case_scores(scores, "knn-per")) == set(CASE_KEYS)
    assert _case_scores(scores, "knn-per") == pytest.approx(_case_scores(expected, "global"), abs=1e-12)
    assert scores["num-cases"] == expected["num-cases"] == 2.0


def test_where_knn_per_mixes_its_case_scores_are_those_of_its_own_masks():
    # Prepare: lam may only be 1, so the prediction is the neighbours' vote, not the model's
    model = PixelHead(0)
    train, val, test = _cases(8, seed=0), _cases(6, seed=1), _cases(10, seed=2)
    settings = dataclasses.replace(SETTINGS, lambda_grid=(1.0,))
    knn = KNNPer(model, settings, "cpu").build(train)
    masks = (mix_probabilities(*knn.probabilities(test.images), 1.0) > 0.5).numpy()

    # Execute
    scores = evaluate_knn_per_at_site(model, train, val, test, settings, "cpu")
    expected = case_metrics({"knn-per": masks}, test.masks, test.ids, test.spacings)

    # Assert: the hand-stacked masks' scores, and not the model's own (the two masks differ)
    assert _case_scores(scores, "knn-per") == pytest.approx(_case_scores(expected, "knn-per"), abs=1e-12)
    assert scores["case-dice-knn-per"] != pytest.approx(evaluate_model(model, test)["case-dice-global"], abs=1e-6)


def test_fedsm_at_lambda_zero_scores_each_case_as_its_super_model_does():
    # Prepare
    model = SuperModel(PixelHead(0), [PixelHead(1), PixelHead(2)], BrightnessSelector(), 0.9)
    train, val, test = _cases(8, seed=0), _cases(6, seed=1), _cases(10, seed=2)
    settings = dataclasses.replace(SETTINGS, lambda_grid=(0.0,))

    # Execute
    scores = evaluate_knn_per_at_site(model.global_model, train, val, test, settings, "cpu", model)
    expected = evaluate_super_model(model, 0, test, 4, torch.device("cpu"), routing=False)

    # Assert
    assert set(_case_scores(scores, "super-knn")) == set(CASE_KEYS)
    assert _case_scores(scores, "super-knn") == pytest.approx(_case_scores(expected, "super"), abs=1e-12)
    assert "case-dice-knn-per" in scores


def test_images_without_cases_get_no_case_scores():
    # Prepare: fundus-like ids name no case
    model = PixelHead(0)
    plain = [dataclasses.replace(_cases(n, seed=s), ids=tuple(f"s/{i:04d}" for i in range(n)), spacings={})
             for n, s in ((8, 0), (6, 1), (10, 2))]

    # Execute
    scores = evaluate_knn_per_at_site(model, *plain, SETTINGS, "cpu")

    # Assert
    assert "dice-knn-per" in scores and not any(key.startswith(("case-", "num-cases")) for key in scores)
