"""kNN-Per on the super model's routed model: reductions to the super model and to plain kNN-Per."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from support.tiny_super_model import BrightnessSelector, PixelHead

from fedsm_core.algorithms.fedsm.routed_knn_per import RoutedKNNPer, evaluate_routed_knn_per
from fedsm_core.algorithms.fedsm.super_model import GLOBAL_ROUTE, SuperModel
from fedsm_core.algorithms.knn_per.knn_per import KNNPer
from fedsm_core.algorithms.knn_per.settings import KNNPerSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.super_model_evaluation import evaluate_super_model

SETTINGS = KNNPerSettings(k=3, capacity=2_000, pixels_per_image=8, backend="torch")


def _split(count: int, seed: int) -> SegArrays:
    """Random images whose brightness spreads over [0, 1] (so routes differ), with a square mask each."""
    rng = np.random.default_rng(seed)
    images = rng.random((count, 3, 8, 8)) * rng.random((count, 1, 1, 1)) * 2.0
    masks = np.zeros((count, 1, 8, 8), np.float32)
    masks[:, 0, 2:6, 2:6] = 1.0
    return SegArrays(images, masks, tuple(f"site/{i}" for i in range(count)))


def _super_model(gamma: float) -> SuperModel:
    return SuperModel(PixelHead(0), [PixelHead(1), PixelHead(2)], BrightnessSelector(), gamma)


def test_lambda_zero_mixes_to_the_super_model_itself():
    # Prepare
    model = _super_model(0.9)
    images = torch.from_numpy(_split(12, seed=1).images)
    knn = RoutedKNNPer(model, SETTINGS).build(_split(10, seed=0))

    # Execute
    p_knn, p_model = knn.probabilities(images)
    _, routes, _ = model.forward_with_routes(images)

    # Assert
    assert len(set(routes.tolist())) >= 2, "the test needs images routed to different models"
    torch.testing.assert_close(p_model, torch.sigmoid(model(images)), rtol=0, atol=0)
    assert p_knn.shape == p_model.shape
    assert ((p_knn >= 0) & (p_knn <= 1)).all()


def test_each_image_reads_the_datastore_of_its_routed_model():
    # Prepare
    model = _super_model(0.9)
    train = _split(10, seed=0)
    images = torch.from_numpy(_split(12, seed=1).images)
    knn = RoutedKNNPer(model, SETTINGS).build(train)

    # Execute
    p_knn, _ = knn.probabilities(images)
    _, routes, _ = model.forward_with_routes(images)

    # Assert: per route, the same estimate as kNN-Per built over that model alone
    for route in routes.unique().tolist():
        chosen = routes == route
        alone = model.global_model if route == GLOBAL_ROUTE else model.personalized[route]
        expected, _ = KNNPer(alone, SETTINGS).build(train).probabilities(images[chosen])
        torch.testing.assert_close(p_knn[chosen], expected, rtol=0, atol=0)
    assert sorted(knn.datastore_sizes()) == sorted(routes.unique().tolist())
    assert set(knn.datastore_sizes().values()) == {len(train) * SETTINGS.pixels_per_image}


def test_gamma_one_reduces_to_knn_per_on_the_global_model():
    # Prepare: every image goes to the global model
    model = _super_model(1.0)
    train, val, test = _split(10, seed=0), _split(6, seed=1), _split(6, seed=2)
    plain = KNNPer(model.global_model, SETTINGS).build(train)
    routed = RoutedKNNPer(model, SETTINGS).build(train)

    # Execute
    plain.choose_lambda(val)
    routed.choose_lambda(val)

    # Assert
    assert routed.lam == plain.lam
    assert routed.evaluate(test) == plain.evaluate(test)
    assert list(routed.datastore_sizes()) == [GLOBAL_ROUTE]


def test_probabilities_before_build_name_the_missing_step():
    knn = RoutedKNNPer(_super_model(0.9), SETTINGS)

    with pytest.raises(ValueError, match=r"call build\(train_data\) first"):
        knn.probabilities(torch.from_numpy(_split(2, seed=0).images))


def test_a_site_step_at_lambda_zero_scores_what_the_super_model_scores():
    # Prepare: lam may only be 0, so the mix is each image's routed model alone
    model = _super_model(0.9)
    train, val, test = _split(10, seed=0), _split(6, seed=1), _split(12, seed=2)
    settings = dataclasses.replace(SETTINGS, lambda_grid=(0.0,))

    # Execute
    scores = evaluate_routed_knn_per(model, train, val, test, settings, "cpu")
    expected = evaluate_super_model(model, 0, test, 4, torch.device("cpu"), routing=False)

    # Assert
    assert scores["dice-super-knn"] == pytest.approx(expected["dice-super"], abs=1e-12)
    assert scores["knn-lambda-super"] == 0.0
    routes = len(set(model.forward_with_routes(torch.from_numpy(test.images))[1].tolist())
                 | set(model.forward_with_routes(torch.from_numpy(val.images))[1].tolist()))
    assert scores["knn-datastore-size-super"] == routes * len(train) * SETTINGS.pixels_per_image
    assert {"knn-build-seconds-super", "knn-seconds-per-image-super"} <= set(scores)
