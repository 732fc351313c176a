"""Tests of FedSM inference routing (Algorithm 2) and the SuperModel."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedsm_core.algorithms.fedsm.super_model import GLOBAL_ROUTE, SuperModel, route


class Tagged(nn.Module):
    """Returns channel 0 of each image plus a tag, and records the batch sizes it saw."""

    def __init__(self, tag: float) -> None:
        super().__init__()
        self.tag = tag
        self.batch_sizes: list[int] = []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(len(images))
        return images[:, :1] + self.tag


class FixedLogits(nn.Module):
    """A selector that ignores its input and returns fixed logits."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("logits", logits)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        assert len(images) == len(self.logits)
        return self.logits


PROBS = torch.tensor(
    [
        [0.25, 0.75, 0.0],  # confident in site 1
        [0.5, 0.25, 0.25],  # max is exactly 0.5
        [1.0, 0.0, 0.0],  # certain of site 0
        [0.375, 0.25, 0.375],  # tie between sites 0 and 2 (max 0.375)
    ],
    dtype=torch.float64,
)


def test_gamma_zero_always_picks_argmax():
    # Prepare
    rows = torch.tensor([[0.25, 0.75, 0.0], [0.5, 0.25, 0.25], [1.0, 0.0, 0.0]], dtype=torch.float64)

    # Execute
    routes = route(rows, 0.0)

    # Assert
    assert routes.dtype == torch.long
    assert routes.tolist() == [1, 0, 0]


def test_gamma_zero_on_uniform_rows_still_picks_a_site():
    # Prepare
    rows = torch.full((3, 4), 0.25, dtype=torch.float64)

    # Execute
    routes = route(rows, 0.0)

    # Assert: ties go to the first maximum (torch.max), so every row goes to site 0
    assert routes.tolist() == [0, 0, 0]


def test_one_gamma_per_model_applies_the_threshold_of_the_candidate_model():
    # Prepare: confidences 0.9 (site 0), 0.7 (site 1), 0.8 (site 2)
    probs = torch.tensor([[0.9, 0.05, 0.05], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8]], dtype=torch.float64)

    # Execute: site 0's model needs > 0.95, site 1's > 0.5, site 2's model is never used (gamma 1)
    routes = route(probs, (0.95, 0.5, 1.0))

    # Assert
    assert routes.tolist() == [GLOBAL_ROUTE, 1, GLOBAL_ROUTE]
    assert route(probs, 0.75).tolist() == [0, GLOBAL_ROUTE, 2]


@pytest.mark.parametrize("gamma, match", [((0.5, 0.5), "2 gammas for 3"), ((0.5, 1.5, 0.0), "outside")])
def test_a_gamma_per_model_must_match_the_models(gamma, match):
    with pytest.raises(ValueError, match=match):
        route(torch.full((1, 3), 1 / 3), gamma)


def test_gamma_one_always_routes_to_global():
    # Prepare / Execute
    routes = route(PROBS, 1.0)

    # Assert
    assert routes.tolist() == [GLOBAL_ROUTE] * 4
    assert GLOBAL_ROUTE == -1


def test_confidence_equal_to_gamma_goes_to_global():
    # Prepare
    # max per row: 0.75, 0.5, 1.0, 0.375; the rule is max > gamma (strict)

    # Execute
    at_half = route(PROBS, 0.5)
    at_three_quarters = route(PROBS, 0.75)
    below_half = route(PROBS, 0.375)

    # Assert
    assert at_half.tolist() == [1, GLOBAL_ROUTE, 0, GLOBAL_ROUTE]
    assert at_three_quarters.tolist() == [GLOBAL_ROUTE, GLOBAL_ROUTE, 0, GLOBAL_ROUTE]
    assert below_half.tolist()[:3] == [1, 0, 0]
    assert below_half.tolist()[3] == GLOBAL_ROUTE  # 0.375 is not > 0.375


@pytest.mark.parametrize("shape", [(3,), (2, 3, 1), ()])
def test_bad_shape_raises(shape):
    # Prepare
    probs = torch.zeros(shape)

    # Execute / Assert
    with pytest.raises(ValueError, match=r"selector_probs must be \[B, K\]"):
        route(probs, 0.5)


@pytest.mark.parametrize("gamma", [-0.01, 1.01, float("nan")])
def test_bad_gamma_raises(gamma):
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="gamma = .* is outside"):
        route(PROBS, gamma)


def _super_model(logits: torch.Tensor, gamma: float) -> SuperModel:
    return SuperModel(Tagged(-100.0), [Tagged(100.0), Tagged(200.0)], FixedLogits(logits), gamma)


def test_forward_with_routes_uses_each_routed_model():
    # Prepare
    # softmax([5, 0]) ~ [0.993, 0.007] -> site 0; softmax([0, 5]) -> site 1; softmax([0, 0]) = [0.5, 0.5] -> global
    logits = torch.tensor([[0.0, 5.0], [5.0, 0.0], [0.0, 0.0], [0.0, 5.0], [0.0, 0.0]])
    images = torch.arange(5 * 2 * 2 * 2, dtype=torch.float32).reshape(5, 2, 2, 2)
    model = _super_model(logits, gamma=0.6)

    # Execute
    outputs, routes, probs = model.forward_with_routes(images)

    # Assert
    assert routes.tolist() == [1, 0, GLOBAL_ROUTE, 1, GLOBAL_ROUTE]
    torch.testing.assert_close(probs, torch.softmax(logits, dim=1))
    tags = {0: 100.0, 1: 200.0, GLOBAL_ROUTE: -100.0}
    assert outputs.shape == (5, 1, 2, 2)
    for index, chosen in enumerate(routes.tolist()):
        torch.testing.assert_close(outputs[index], images[index, :1] + tags[chosen])
    # each model ran once, on only the images routed to it
    assert model.personalized[0].batch_sizes == [1]
    assert model.personalized[1].batch_sizes == [2]
    assert model.global_model.batch_sizes == [2]


def test_forward_equals_forward_with_routes_logits():
    # Prepare
    logits = torch.tensor([[0.0, 5.0], [0.0, 0.0]])
    images = torch.rand(2, 1, 2, 2)

    # Execute
    plain = _super_model(logits, gamma=0.6)(images)
    routed = _super_model(logits, gamma=0.6).forward_with_routes(images)[0]

    # Assert
    torch.testing.assert_close(plain, routed)


def test_gamma_one_sends_everything_to_global_model():
    # Prepare
    logits = torch.tensor([[0.0, 50.0], [50.0, 0.0]])
    images = torch.rand(2, 1, 2, 2)
    model = _super_model(logits, gamma=1.0)

    # Execute
    outputs, routes, _ = model.forward_with_routes(images)

    # Assert
    assert routes.tolist() == [GLOBAL_ROUTE, GLOBAL_ROUTE]
    torch.testing.assert_close(outputs, images[:, :1] - 100.0)
    assert model.personalized[0].batch_sizes == [] and model.personalized[1].batch_sizes == []


def test_selector_width_must_match_personalized_count():
    # Prepare
    model = SuperModel(Tagged(0.0), [Tagged(1.0), Tagged(2.0)], FixedLogits(torch.zeros(1, 3)), 0.5)

    # Execute / Assert
    with pytest.raises(ValueError, match=r"selector has 3 outputs but the super model expects 2 \(2 personalized"):
        model.forward_with_routes(torch.zeros(1, 1, 2, 2))


def test_extra_selector_routes_by_argmax_with_index_zero_global():
    # Prepare: K = 2 personalized models; the selector has K + 1 = 3 outputs; gamma is ignored
    logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 3.0, 0.0]])
    model = SuperModel(Tagged(0.0), [Tagged(1.0), Tagged(2.0)], FixedLogits(logits), 0.99,
                       selector_includes_global=True)

    # Execute
    outputs, routes, _ = model.forward_with_routes(torch.zeros(3, 1, 2, 2))

    # Assert
    assert routes.tolist() == [-1, 1, 0]
    assert [float(o.flatten()[0]) for o in outputs] == [0.0, 2.0, 1.0]


def test_forward_with_routes_does_not_track_gradients():
    # Prepare
    selector = nn.Linear(4, 2)
    model = SuperModel(nn.Identity(), [nn.Identity(), nn.Identity()], nn.Sequential(nn.Flatten(), selector), 0.5)

    # Execute
    outputs, _, probs = model.forward_with_routes(torch.rand(3, 1, 2, 2))

    # Assert
    assert not outputs.requires_grad
    assert not probs.requires_grad
