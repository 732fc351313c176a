"""kNN-Per for segmentation: embeddings, kernel, mixing, lambda choice and the whole client step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedsm_core.algorithms.knn_per.knn_per import (
    KNNPer,
    choose_lambda,
    dice_per_lambda,
    embed_pixels,
    evaluate_knn_per,
    find_segmentation_head,
    mix_probabilities,
)
from fedsm_core.algorithms.knn_per.search import (
    faiss_available,
    gaussian_kernel,
    knn_probabilities,
)
from fedsm_core.algorithms.knn_per.settings import LAMBDA_GRID, KNNPerSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.super_model_evaluation import evaluate_model
from fedsm_core.models.spec import ModelSpec

BACKENDS = ["torch", *(["faiss"] if faiss_available() else [])]


class _Tiny(nn.Module):
    """Pixel-wise features then a 1x1 head; float64 so checks are exact."""

    def __init__(self, structures: int = 2, zero_head: bool = False) -> None:
        super().__init__()
        self.body = nn.Conv2d(3, 4, 1).double()
        self.segmentation_head = nn.Conv2d(4, structures, 1).double()
        if zero_head:
            nn.init.zeros_(self.segmentation_head.weight)
            nn.init.zeros_(self.segmentation_head.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.segmentation_head(torch.tanh(self.body(images)))


class _Wrapped(nn.Module):
    """The U-Net under an attribute, as a model with extra parts would hold it."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)


def _split(count: int, size: int, dtype: type = np.float64, seed: int = 0) -> SegArrays:
    """Random images (float64 for the tiny models, float32 for the U-Net) with a disc and a cup inside it."""
    rng = np.random.default_rng(seed)
    images = rng.random((count, 3, size, size)).astype(dtype)
    masks = np.zeros((count, 2, size, size), np.float32)
    masks[:, 0, size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = 1.0
    masks[:, 1, 3 * size // 8 : 5 * size // 8, 3 * size // 8 : 5 * size // 8] = 1.0
    return SegArrays(images, masks, tuple(f"site/{i}" for i in range(count)))


def _unet() -> nn.Module:
    torch.manual_seed(0)
    return ModelSpec("mobilenet_v2", 2, 3).build_segmentation()


def test_head_is_found_in_a_wrapped_model_and_its_input_is_the_embedding():
    # Prepare
    torch.manual_seed(0)
    model = _Wrapped(_Tiny())
    images = torch.from_numpy(_split(2, 4).images)

    # Execute
    head = find_segmentation_head(model)
    embeddings, logits = embed_pixels(model, images)

    # Assert
    assert head is model.net.segmentation_head
    assert torch.equal(embeddings, torch.tanh(model.net.body(images)))
    assert torch.equal(logits, model(images))


def test_unet_pixel_embeddings_are_the_last_decoder_features():
    # Prepare
    model = _unet().eval()
    images = torch.rand(2, 3, 32, 32)

    # Execute
    embeddings, logits = embed_pixels(model, images)

    # Assert: the default decoder's last stage has 8 channels, at full resolution
    assert embeddings.shape == (2, 8, 32, 32) and logits.shape == (2, 2, 32, 32)


@pytest.mark.parametrize("heads", [0, 2])
def test_a_model_without_exactly_one_head_is_rejected(heads):
    # Prepare
    model = nn.Sequential(*[_Tiny() for _ in range(heads)]) if heads else nn.Conv2d(3, 2, 1)

    # Execute / Assert
    with pytest.raises(ValueError, match=f"exactly one submodule named '\\*segmentation_head'.*found {heads}"):
        find_segmentation_head(model)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lambda_zero_is_the_global_model(backend):
    # Prepare
    model = _unet()
    data = _split(3, 32, np.float32)
    knn_per = KNNPer(model, KNNPerSettings(backend=backend, pixels_per_image=64)).build(data)
    images = torch.from_numpy(data.images)

    # Execute
    mixed = mix_probabilities(*knn_per.probabilities(images), 0.0)

    # Assert: 0 * p_knn + 1 * p_model is p_model bit for bit
    with torch.no_grad():
        assert torch.equal(mixed, torch.sigmoid(model(images)))


def test_lambda_zero_evaluates_like_evaluate_model():
    # Prepare
    model = _unet()
    data = _split(3, 32, np.float32)
    knn_per = KNNPer(model, KNNPerSettings(lam=0.0, pixels_per_image=64)).build(data)

    # Execute
    metrics = knn_per.evaluate(data)

    # Assert
    expected = evaluate_model(model, data)
    assert metrics["dice-knn-per"] == pytest.approx(expected["dice-global"], abs=1e-12)
    assert metrics["dice-global"] == pytest.approx(expected["dice-global"], abs=1e-12)
    assert metrics["num-images"] == 3.0 and metrics["knn-lambda"] == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_lambda_one_with_one_neighbour_returns_the_stored_label(backend):
    # Prepare: every pixel of 8x8 images is stored, so each query has an identical stored embedding
    torch.manual_seed(0)
    model = _Wrapped(_Tiny())
    data = _split(2, 8)
    settings = KNNPerSettings(k=1, lam=1.0, backend=backend, pixels_per_image=64)
    knn_per = KNNPer(model, settings).build(data)

    # Execute
    mixed = mix_probabilities(*knn_per.probabilities(data.images), knn_per.lam)

    # Assert
    assert len(knn_per.datastore) == 128
    assert torch.equal(mixed, torch.from_numpy(data.masks).double())


def test_gaussian_kernel_and_knn_estimate_match_hand_computation():
    # Prepare: squared distances 0, 1, 4 in dim 2, scale 1; labels of the neighbours 1, 0, 1
    squared = torch.tensor([[0.0, 1.0, 4.0]], dtype=torch.float64)
    labels = torch.tensor([[1.0], [0.0], [1.0]], dtype=torch.float64)

    # Execute
    weights = gaussian_kernel(squared, dim=2, scale=1.0)
    p_knn = knn_probabilities(squared, torch.tensor([[0, 1, 2]]), labels, dim=2, scale=1.0)

    # Assert: w = exp(-d^2 / 2) = [1, e^-0.5, e^-2]; p = (1 + e^-2) / (1 + e^-0.5 + e^-2)
    np.testing.assert_allclose(weights.numpy(), [[1.0, math.exp(-0.5), math.exp(-2.0)]], rtol=1e-15)
    expected = (1 + math.exp(-2.0)) / (1 + math.exp(-0.5) + math.exp(-2.0))
    assert p_knn.item() == pytest.approx(expected, rel=1e-14)


def test_kernel_scale_widens_the_kernel():
    # Prepare / Execute: d^2 = 4, dim 2, scale 4 -> exp(-4 / 8)
    weight = gaussian_kernel(torch.tensor([4.0], dtype=torch.float64), dim=2, scale=4.0)

    # Assert
    assert weight.item() == pytest.approx(math.exp(-0.5), rel=1e-15)


def test_far_queries_still_get_finite_estimates():
    # Prepare: exp(-1e4) underflows to 0 for both neighbours
    squared = torch.tensor([[1e4, 1e4 + 1.0]], dtype=torch.float64)
    labels = torch.tensor([[1.0], [0.0]], dtype=torch.float64)

    # Execute
    p_knn = knn_probabilities(squared, torch.tensor([[0, 1]]), labels, dim=1)

    # Assert: the ratio is that of distances 0 and 1: 1 / (1 + e^-1)
    assert p_knn.item() == pytest.approx(1.0 / (1.0 + math.exp(-1.0)), rel=1e-14)


def test_lambda_choice_is_the_argmax_on_a_constructed_case():
    # Prepare: pixel A (label 1): p_model 0, p_knn 1 -> p = lam, right only when lam > 0.5;
    #          pixel B (label 0): p_model 0, p_knn 0.8 -> p = 0.8 lam, right only when lam <= 0.625
    p_model = torch.zeros(1, 1, 1, 2, dtype=torch.float64)
    p_knn = torch.tensor([[[[1.0, 0.8]]]], dtype=torch.float64)
    masks = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)

    # Execute
    dice = dice_per_lambda(p_knn, p_model, masks, LAMBDA_GRID)
    lam = choose_lambda(dice.mean(dim=0).tolist(), LAMBDA_GRID)

    # Assert: Dice 0 up to 0.5 (A missed), 1 at 0.6, 2 / 3 from 0.7 (B a false positive)
    np.testing.assert_allclose(dice[0].numpy(), [0.0] * 6 + [1.0] + [2 / 3] * 4)
    assert lam == 0.6


def test_lambda_ties_go_to_the_smallest():
    # Prepare / Execute / Assert
    assert choose_lambda([0.2, 0.9, 0.9], [0.0, 0.5, 1.0]) == 0.5
    with pytest.raises(ValueError, match="2 Dice values for 3 lambdas"):
        choose_lambda([0.1, 0.2], [0.0, 0.5, 1.0])


def test_choose_lambda_on_validation_trusts_a_perfect_datastore():
    # Prepare: a zero head predicts p = 0.5 (no foreground); the kNN estimate (k = 1, all pixels) is exact
    torch.manual_seed(0)
    model = _Wrapped(_Tiny(zero_head=True))
    data = _split(2, 8)
    knn_per = KNNPer(model, KNNPerSettings(k=1, lam=0.0, pixels_per_image=64)).build(data)

    # Execute
    lam = knn_per.choose_lambda(data)
    metrics = knn_per.evaluate(data)

    # Assert: every lam > 0 is perfect, so the smallest, 0.1, is chosen
    assert lam in LAMBDA_GRID and lam == 0.1 and knn_per.lam == 0.1
    assert metrics["dice-knn-per"] == 1.0 and metrics["dice-global"] < 1.0


def test_predicting_before_building_is_rejected():
    with pytest.raises(ValueError, match="call build"):
        KNNPer(_Tiny()).probabilities(torch.zeros(1, 3, 4, 4, dtype=torch.float64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_runs_on_the_model_device():
    # Prepare
    model = _unet().cuda()
    data = _split(2, 32, np.float32)

    # Execute
    knn_per = KNNPer(model, KNNPerSettings(backend="auto", pixels_per_image=64)).build(data)
    mixed = mix_probabilities(*knn_per.probabilities(data.images), knn_per.lam)

    # Assert
    assert knn_per.device.type == "cuda" and mixed.is_cuda and knn_per._index.backend == "torch"


def test_the_whole_client_step_chooses_lambda_on_validation_and_reports_its_cost():
    # Prepare: a grid of {0} forces the global model, so the test Dice is evaluate_model's
    model = _unet()
    train, val, test = _split(3, 32, np.float32, seed=1), _split(2, 32, np.float32, seed=2), _split(2, 32, np.float32)
    settings = KNNPerSettings(pixels_per_image=16, capacity=40, lambda_grid=(0.0,))

    # Execute
    metrics = evaluate_knn_per(model, train, val, test, settings, "cpu")

    # Assert
    assert metrics["dice-knn-per"] == pytest.approx(evaluate_model(model, test)["dice-global"], abs=1e-12)
    assert metrics["knn-lambda"] == 0.0
    assert metrics["knn-datastore-size"] == 40.0  # 3 x 16 sampled pixels, capped at the capacity
    assert metrics["knn-seconds-per-image"] > 0 and metrics["knn-build-seconds"] > 0
