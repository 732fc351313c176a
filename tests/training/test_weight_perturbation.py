"""HarmoFL's weight perturbation as a hook of the one local loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedsm_core.training.local_update import Learner
from fedsm_core.training.weight_perturbation import WeightPerturbation


def _learner(alpha: float | None) -> Learner:
    model = nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]], dtype=torch.float64))
    hooks = () if alpha is None else (WeightPerturbation(alpha),)
    return Learner("m", model, torch.optim.SGD(model.parameters(), lr=0.1), lambda y, t: ((y - t) ** 2).mean(),
                   hooks=hooks)


X = torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)
T = torch.tensor([[0.5], [1.0]], dtype=torch.float64)


def _gradient(w: torch.Tensor) -> torch.Tensor:
    # L(w) = mean((X w - t)^2)  ->  grad = 2/N X^T (X w - t)
    return (2.0 / len(X)) * X.T @ (X @ w.reshape(2, 1) - T)


def test_alpha_zero_takes_exactly_a_plain_step():
    plain, perturbed = _learner(None), _learner(0.0)
    plain.step(X, T)
    perturbed.step(X, T)
    torch.testing.assert_close(perturbed.model.weight, plain.model.weight, rtol=0, atol=0)


def test_the_step_uses_the_gradient_at_the_perturbed_weights():
    learner = _learner(0.5)
    w = torch.tensor([1.0, -2.0], dtype=torch.float64)
    g = _gradient(w).flatten()
    g_perturbed = _gradient(w + 0.5 * g / g.norm()).flatten()

    learner.step(X, T)

    # SGD from the restored w with the perturbed gradient
    torch.testing.assert_close(learner.model.weight.flatten(), w - 0.1 * g_perturbed, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(g_perturbed, g)


def test_negative_alpha_is_refused():
    with pytest.raises(ValueError, match="alpha"):
        WeightPerturbation(-0.1)
