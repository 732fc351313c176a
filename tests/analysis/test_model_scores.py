"""Per-image scores of every candidate model and the routing rules computed from them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsm_core.algorithms.fedsm.super_model import SuperModel
from fedsm_core.analysis.model_scores import (
    GLOBAL_COLUMN,
    ModelScores,
    dice_by_gamma,
    route_images,
    routed_dice,
    score_every_model,
    selection_frequencies,
    softmax,
)
from fedsm_core.data.arrays import SegArrays
from fedsm_core.metrics import dice_per_image
from fedsm_core.models.spec import ModelSpec

# ---------------------------------------------------------------- softmax

def test_softmax_hand_values_in_float64():
    # [0, ln 3] -> [1/4, 3/4]; equal logits -> uniform; huge logits must not overflow
    logits = np.array([[0.0, math.log(3.0)], [2.0, 2.0], [1000.0, 1000.0 - math.log(4.0)]], dtype=np.float32)

    probs = softmax(logits)

    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs, [[0.25, 0.75], [0.5, 0.5], [0.8, 0.2]], rtol=0, atol=1e-6)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)


def test_softmax_divides_logits_by_the_temperature():
    # logits [0, 2 ln 3] at T = 2 are [0, ln 3]: [1/4, 3/4]; at T = 1 they give [1/10, 9/10]
    logits = np.array([[0.0, 2.0 * math.log(3.0)]])

    np.testing.assert_allclose(softmax(logits, 2.0), [[0.25, 0.75]], rtol=0, atol=1e-12)
    np.testing.assert_allclose(softmax(logits, 1.0), [[0.1, 0.9]], rtol=0, atol=1e-12)
    # a large temperature flattens towards uniform, a small one sharpens
    assert softmax(logits, 100.0)[0, 1] < 0.52
    assert softmax(logits, 0.1)[0, 1] > 1 - 1e-9


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_softmax_rejects_non_positive_temperature(temperature):
    with pytest.raises(ValueError, match="must be > 0"):
        softmax(np.zeros((1, 2)), temperature)


# ---------------------------------------------------------------- routing

def test_route_images_is_strictly_greater_than_gamma():
    probs = np.array([[0.6, 0.4],    # confidence equal to gamma -> global
                      [0.5, 0.5],    # below -> global
                      [0.3, 0.7],    # above -> site 1
                      [0.8, 0.2]])   # above -> site 0

    np.testing.assert_array_equal(route_images(probs, 0.6), [-1, -1, 1, 0])
    np.testing.assert_array_equal(route_images(probs, 0.0), [0, 0, 1, 0])  # ties go to the first site
    np.testing.assert_array_equal(route_images(probs, 1.0), [-1, -1, -1, -1])


def test_routed_dice_picks_the_column_of_the_routed_model():
    dice = np.array([[0.1, 0.2, 0.3],
                     [0.4, 0.5, 0.6],
                     [0.7, 0.8, 0.9]])

    picked = routed_dice(dice, np.array([-1, 1, 0]))

    np.testing.assert_array_equal(picked, [0.1, 0.6, 0.8])


def test_selection_frequencies_of_hand_made_routes():
    routes = np.array([-1, 0, 1, 1, 1, -1, 1, 1])

    shares = selection_frequencies(routes, ("a", "b", "c"))

    assert list(shares) == ["global", "a", "b", "c"]
    assert shares == {"global": 2 / 8, "a": 1 / 8, "b": 5 / 8, "c": 0.0}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-15)


def test_dice_by_gamma_on_a_hand_made_case():
    # confidences 0.9 (site 0), 0.6 (site 1), 0.35 (site 2)
    probs = np.array([[0.90, 0.05, 0.05],
                      [0.20, 0.60, 0.20],
                      [0.33, 0.32, 0.35]])
    dice = np.array([[0.5, 0.9, 0.0, 0.0],
                     [0.6, 0.0, 0.2, 0.0],
                     [0.7, 0.0, 0.0, 0.1]])
    gammas = [0.0, 0.45, 0.75, 0.95]

    curve = dice_by_gamma(dice, probs, gammas)

    # 0.00: all routed: (0.9 + 0.2 + 0.1) / 3;  0.45: third global: (0.9 + 0.2 + 0.7) / 3
    # 0.75: only the first routed: (0.9 + 0.6 + 0.7) / 3;  0.95: all global: (0.5 + 0.6 + 0.7) / 3
    assert curve == pytest.approx([1.2 / 3, 1.8 / 3, 2.2 / 3, 1.8 / 3], abs=1e-12)
    assert all(isinstance(value, float) for value in curve)


# ---------------------------------------------------------------- score_every_model

SPEC = ModelSpec("mobilenet_v2", 1, 2, 8)


def _constant_output(model: torch.nn.Module, bias: float) -> torch.nn.Module:
    """Make a U-Net predict ``bias`` everywhere (all foreground for > 0, all background for < 0)."""
    head = model.segmentation_head[0]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(bias)
    return model


@pytest.fixture(scope="module")
def scored():
    torch.manual_seed(0)
    global_model = _constant_output(SPEC.build_segmentation(), 10.0)     # all foreground
    first = _constant_output(SPEC.build_segmentation(), -10.0)           # all background
    second = SPEC.build_segmentation()                                   # random weights
    selector = SPEC.build_selector()
    model = SuperModel(global_model, [first, second], selector, gamma=0.5)
    rng = np.random.default_rng(0)
    images = rng.random((3, 3, 32, 32)).astype(np.float32)
    masks = np.zeros((3, 1, 32, 32), np.float32)
    masks[0, 0, :16] = 1.0     # 512 foreground pixels
    masks[1, 0, :8, :8] = 1.0  # 64
    masks[2, 0, :, :] = 1.0    # 1024
    data = SegArrays(images, masks, ("x/0", "x/1", "x/2"))
    # batch_size 2: the last batch holds one image, so concatenation over batches is exercised
    return model, data, score_every_model(model, data, batch_size=2)


def test_score_every_model_shapes_and_types(scored):
    model, data, scores = scored

    assert isinstance(scores, ModelScores)
    assert len(scores) == 3 and scores.ids == ("x/0", "x/1", "x/2")
    assert scores.dice.shape == (3, 3) and scores.dice.dtype == np.float64
    assert scores.logits.shape == (3, 2) and scores.logits.dtype == np.float64
    assert scores.features.ndim == 2 and scores.features.shape[0] == 3 and scores.features.dtype == np.float32
    with torch.no_grad():
        embedded = model.selector.embed(torch.from_numpy(data.images))
    assert scores.features.shape[1] == embedded.shape[1]


def test_score_every_model_columns_are_each_models_dice(scored):
    model, data, scores = scored
    images, masks = torch.from_numpy(data.images), torch.from_numpy(data.masks)

    # Assert: hand values of the constant models: all foreground 2|Y| / (|Y| + 1024); all background 0
    assert GLOBAL_COLUMN == 0
    np.testing.assert_allclose(scores.dice[:, 0], [1024 / 1536, 128 / 1088, 1.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(scores.dice[:, 1], [0.0, 0.0, 0.0], rtol=0, atol=1e-12)
    with torch.no_grad():
        expected_global = dice_per_image(model.global_model(images), masks).numpy()
        expected_second = dice_per_image(model.personalized[1](images), masks).numpy()
        expected_logits = model.selector(images).double().numpy()
    np.testing.assert_allclose(scores.dice[:, 0], expected_global, rtol=0, atol=1e-12)
    np.testing.assert_allclose(scores.dice[:, 2], expected_second, rtol=0, atol=1e-12)
    np.testing.assert_allclose(scores.logits, expected_logits, rtol=1e-5, atol=1e-5)
