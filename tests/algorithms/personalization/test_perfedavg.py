"""Per-FedAvg (first order): one FO-MAML step and the deployed adaptation by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.personal_models import linear, make_start

from fedsm_core.algorithms.personalization.perfedavg import split_batch, start_perfedavg

INPUTS = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
TARGETS = torch.tensor([[0.0], [1.0]], dtype=torch.float64)


def test_one_fo_maml_step_matches_hand_computation():
    # Prepare: theta = [1, -2], b = 0.5; alpha = 0.1; outer SGD beta = 0.1
    #          D = (x1 = [1, 0], y1 = 0), D' = (x2 = [0, 1], y2 = 1)
    global_model = linear([1.0, -2.0], 0.5)
    trainer = start_perfedavg(make_start(global_model, linear([5.0, 5.0], 5.0), lr=0.1, perfedavg_alpha=0.1))

    # Execute
    loss = trainer.learner.step(INPUTS, TARGETS)

    # Assert
    # inner: r1 = 1 + 0.5 = 1.5, grad = 2 * 1.5 [1, 0 | 1] = [3, 0 | 3];  theta_tmp = [0.7, -2 | 0.2]
    # outer at theta_tmp on D': r2 = -2 + 0.2 - 1 = -2.8, loss = 7.84, grad = 2 * -2.8 [0, 1 | 1] = [0, -5.6 | -5.6]
    # theta <- [1, -2 | 0.5] - 0.1 [0, -5.6 | -5.6] = [1, -1.44 | 1.06]   (started from w, not the personalized model)
    assert loss == pytest.approx(7.84)
    np.testing.assert_allclose(trainer.learner.model.weight.detach().numpy(), [[1.0, -1.44]])
    np.testing.assert_allclose(trainer.learner.model.bias.detach().numpy(), [1.06])


def test_deployed_model_is_one_step_on_the_whole_split():
    # Prepare: the meta-model after the step above, [1, -1.44 | 1.06]; the split comes as two one-image batches
    trainer = start_perfedavg(make_start(linear([1.0, -2.0], 0.5), lr=0.1, perfedavg_alpha=0.1))
    trainer.learner.step(INPUTS, TARGETS)

    # Execute
    deployed = trainer.deployed(lambda: [(INPUTS[:1], TARGETS[:1]), (INPUTS[1:], TARGETS[1:])])

    # Assert
    # r1 = 1 + 1.06 = 2.06, r2 = -1.44 + 1.06 - 1 = -1.38;  mean-loss gradient = [2.06, -1.38 | 0.68]
    # theta - 0.1 * gradient = [0.794, -1.302 | 0.992]
    np.testing.assert_allclose(deployed["weight"], [[0.794, -1.302]])
    np.testing.assert_allclose(deployed["bias"], [0.992])


def test_split_batch_halves_and_one_image_serves_as_both():
    (inner, _), (outer, _) = split_batch(torch.arange(5.0)[:, None], torch.zeros(5, 1))
    (alone, _), (same, _) = split_batch(torch.ones(1, 1), torch.zeros(1, 1))
    assert inner.flatten().tolist() == [0.0, 1.0] and outer.flatten().tolist() == [2.0, 3.0, 4.0]
    assert torch.equal(alone, same)
