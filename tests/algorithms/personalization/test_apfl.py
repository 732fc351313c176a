"""APFL: the parameter mixture, the gradient of alpha, the deployed model and the state kept by the site."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.personal_models import linear, make_start

from fedsm_core.algorithms.personalization.apfl import ALPHA_KEY, ParameterMixture, start_apfl

X = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
Y = torch.tensor([[0.0]], dtype=torch.float64)


def test_alpha_fixed_at_zero_gives_the_global_models_output_and_leaves_v_alone():
    # Prepare: v and w differ; alpha = 0 and not learned
    global_model, local = linear([1.0, -2.0], 0.5), linear([3.0, 4.0], -1.0)
    trainer = start_apfl(make_start(global_model, local, apfl_alpha=0.0, apfl_alpha_lr=0.0))
    inputs = torch.tensor([[0.3, -1.2], [2.0, 0.5]], dtype=torch.float64)

    # Execute
    mixed = trainer.learner.model(inputs)
    trainer.learner.step(inputs, torch.zeros(2, 1, dtype=torch.float64))

    # Assert: grad_v = alpha * grad f = 0, so v keeps its weights and alpha stays 0
    torch.testing.assert_close(mixed, global_model(inputs))
    torch.testing.assert_close(trainer.learner.model(inputs), global_model(inputs))
    np.testing.assert_allclose(trainer.client_state()["apfl-local|weight"], [[3.0, 4.0]])
    assert float(trainer.client_state()[ALPHA_KEY]) == 0.0


def test_alpha_gradient_and_one_step_match_hand_computation():
    # Prepare: v = [2, 0], b_v = 0; w = [1, -2], b_w = 0.5; alpha = 0.5; x = [1, 1], y = 0
    global_model, local = linear([1.0, -2.0], 0.5), linear([2.0, 0.0], 0.0)
    trainer = start_apfl(make_start(global_model, local, lr=0.1, apfl_alpha=0.5, apfl_alpha_lr=0.1))
    mixture = trainer.learner.model

    # Execute
    loss = torch.nn.functional.mse_loss(mixture(X), Y)
    (alpha_gradient,) = torch.autograd.grad(loss, [mixture.alpha])
    trainer.learner.step(X, Y)

    # Assert
    # v_bar = [1.5, -1], b = 0.25;  r = 1.5 - 1 + 0.25 = 0.75;  grad f(v_bar) = 2 r [1, 1 | 1] = [1.5, 1.5 | 1.5]
    # d f / d alpha = <v - w, grad f> = 1 * 1.5 + 2 * 1.5 + (0 - 0.5) * 1.5 = 3.75
    assert alpha_gradient.item() == pytest.approx(3.75)
    # alpha <- 0.5 - 0.1 * 3.75 = 0.125;  v <- v - 0.1 * alpha * grad f = [2, 0 | 0] - 0.075
    assert mixture.alpha.item() == pytest.approx(0.125)
    np.testing.assert_allclose(mixture.local.weight.detach().numpy(), [[1.925, -0.075]])
    np.testing.assert_allclose(mixture.local.bias.detach().numpy(), [-0.075])
    assert mixture.alpha.grad is None


def test_alpha_is_clipped_to_the_unit_interval():
    # Prepare: the step 0.5 - 1.0 * 3.75 would leave [0, 1]
    trainer = start_apfl(make_start(linear([1.0, -2.0], 0.5), linear([2.0, 0.0], 0.0), apfl_alpha=0.5,
                                    apfl_alpha_lr=1.0))

    # Execute
    trainer.learner.step(X, Y)

    # Assert
    assert trainer.learner.model.alpha.item() == 0.0


def test_deployed_model_is_the_parameter_mixture_and_the_state_round_trips():
    # Prepare: alpha = 0.25, no learning
    global_model, local = linear([1.0, -2.0], 0.5), linear([3.0, 2.0], 1.5)
    trainer = start_apfl(make_start(global_model, local, apfl_alpha=0.25, apfl_alpha_lr=0.0))

    # Execute
    deployed = trainer.deployed(list)
    state = trainer.client_state()
    resumed = start_apfl(make_start(global_model, linear([9.0, 9.0], 9.0), client_state=state, apfl_alpha=0.9))

    # Assert: 0.25 * [3, 2 | 1.5] + 0.75 * [1, -2 | 0.5] = [1.5, -1 | 0.75]
    np.testing.assert_allclose(deployed["weight"], [[1.5, -1.0]])
    np.testing.assert_allclose(deployed["bias"], [0.75])
    assert resumed.learner.model.alpha.item() == 0.25  # from the state, not apfl-alpha
    np.testing.assert_allclose(resumed.learner.model.local.weight.detach().numpy(), [[3.0, 2.0]])


def test_mixture_rejects_alpha_outside_the_unit_interval():
    with pytest.raises(ValueError, match="apfl-alpha = 1.5"):
        ParameterMixture(linear([0.0, 0.0], 0.0), linear([0.0, 0.0], 0.0), 1.5)
