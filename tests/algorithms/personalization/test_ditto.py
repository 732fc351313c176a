"""Ditto: lambda = 0 is local training; one step with lambda > 0 by hand."""

from __future__ import annotations

import numpy as np
import torch
from support.personal_models import linear, make_start

from fedsm_core.algorithms.personalization.base import start_softpull
from fedsm_core.algorithms.personalization.ditto import start_ditto
from fedsm_core.training.local_update import train_local


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(6, 2, generator=generator, dtype=torch.float64)
    targets = torch.randn(6, 1, generator=generator, dtype=torch.float64)
    return [(inputs[:3], targets[:3]), (inputs[3:], targets[3:])]


def test_ditto_with_lambda_zero_is_local_training_of_v():
    # Prepare: v and w differ, so a wrong start or a live anchor would show
    start = make_start(linear([1.0, -2.0], 0.5), linear([0.3, 0.7], -0.2), ditto_lambda=0.0)
    ditto, local = start_ditto(start), start_softpull(start)

    # Execute
    for trainer in (ditto, local):
        train_local([trainer.learner], _batches, epochs=3)

    # Assert
    for key, value in local.deployed(list).items():
        np.testing.assert_array_equal(ditto.deployed(list)[key], value)


def test_ditto_step_matches_hand_computation_and_anchors_on_the_received_global_model():
    # Prepare: v = [2, 0], b = 0; w = [1, -2], b = 0.5; lambda = 0.5; SGD lr 0.1; x = [1, 1], y = 0
    global_model = linear([1.0, -2.0], 0.5)
    trainer = start_ditto(make_start(global_model, linear([2.0, 0.0], 0.0), lr=0.1, ditto_lambda=0.5))
    with torch.no_grad():
        global_model.weight.add_(100.0)  # the global learner moves its copy; Ditto's anchor must not follow

    # Execute
    trainer.learner.step(torch.tensor([[1.0, 1.0]], dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64))

    # Assert
    # r = 2 + 0 + 0 - 0 = 2;  grad f = 2 r [1, 1 | 1] = [4, 4 | 4]
    # lambda (v - w) = 0.5 [1, 2 | -0.5] = [0.5, 1 | -0.25]
    # v <- [2, 0 | 0] - 0.1 [4.5, 5 | 3.75] = [1.55, -0.5 | -0.375]
    weights = trainer.deployed(list)
    np.testing.assert_allclose(weights["weight"], [[1.55, -0.5]])
    np.testing.assert_allclose(weights["bias"], [-0.375])
