"""FedProx: the proximal term, its gradient, and its reduction to FedAvg."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedsm_core.algorithms.baselines.fedprox import ProximalTerm
from fedsm_core.training.local_update import Learner, train_local


def _linear() -> nn.Linear:
    layer = nn.Linear(2, 1).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -2.0]]))
        layer.bias.copy_(torch.tensor([0.5]))
    return layer


def proximal_gradient(weights: Mapping[str, np.ndarray], anchor: Mapping[str, np.ndarray],
                      mu: float) -> dict[str, np.ndarray]:
    """The term's gradient ``mu * (w - w_global)``, written out: the oracle of the autograd gradient."""
    return {name: mu * (np.asarray(weights[name]) - np.asarray(anchor[name])) for name in weights}


def test_proximal_gradient_matches_hand_computation():
    # Prepare: anchor w0 = [1, -2], b0 = 0.5; move to w = [2, 0], b = 0.5; mu = 0.1
    model = _linear()
    hook = ProximalTerm(model, mu=0.1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[2.0, 0.0]]))

    # Execute
    term = hook.extra_loss(model)
    term.backward()

    # Assert
    # term = 0.1 / 2 * ((2 - 1)^2 + (0 + 2)^2) = 0.05 * 5 = 0.25;  grad_w = 0.1 * [1, 2] = [0.1, 0.2]
    assert term.item() == pytest.approx(0.25)
    np.testing.assert_allclose(model.weight.grad.numpy(), [[0.1, 0.2]])
    np.testing.assert_allclose(model.bias.grad.numpy(), [0.0])
    expected = proximal_gradient({"w": np.array([2.0, 0.0])}, {"w": np.array([1.0, -2.0])}, 0.1)
    np.testing.assert_allclose(expected["w"], [0.1, 0.2])


def _train(mu: float | None) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = _linear()
    hooks = [] if mu is None else [ProximalTerm(model, mu)]
    learner = Learner("m", model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.mse_loss, hooks=hooks)
    inputs = torch.randn(6, 2, dtype=torch.float64)
    targets = torch.randn(6, 1, dtype=torch.float64)
    train_local([learner], lambda: [(inputs[:3], targets[:3]), (inputs[3:], targets[3:])], epochs=3)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_fedprox_with_mu_zero_is_fedavg_local_training():
    plain, prox = _train(None), _train(0.0)
    for key in plain:
        assert torch.equal(plain[key], prox[key])


def test_positive_mu_keeps_the_model_closer_to_the_anchor():
    anchor = _linear().state_dict()
    distance = {mu: sum(((_train(mu)[k] - anchor[k]) ** 2).sum().item() for k in anchor) for mu in (0.0, 10.0)}
    assert distance[10.0] < distance[0.0]


def test_negative_mu_is_rejected():
    with pytest.raises(ValueError, match="proximal-mu = -1"):
        ProximalTerm(_linear(), -1.0)
