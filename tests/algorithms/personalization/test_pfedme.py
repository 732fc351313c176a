"""pFedMe: K inner steps on the Moreau envelope and the local-model update, by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.personal_models import linear, make_start

from fedsm_core.algorithms.personalization.pfedme import MoreauEnvelope, start_pfedme


def test_one_outer_step_matches_hand_computation():
    # Prepare: theta = w_k = [1, -2], b = 0.5 (the received global model); lambda = 1, K = 2, eta = 0.5;
    # inner SGD lr 0.1; x = [1, 1], y = 0
    trainer = start_pfedme(make_start(linear([1.0, -2.0], 0.5), linear([7.0, 7.0], 7.0), lr=0.1,
                                      pfedme_lambda=1.0, pfedme_k=2, pfedme_eta=0.5))

    # Execute
    loss = trainer.learner.step(torch.tensor([[1.0, 1.0]], dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64))

    # Assert
    # inner 1: r = -0.5, grad f = [-1, -1 | -1], prox 0;           theta = [1.1, -1.9 | 0.6]
    # inner 2: r = -0.2, grad f = [-0.4, -0.4 | -0.4], prox = [0.1, 0.1 | 0.1];  theta = [1.13, -1.87 | 0.63]
    # w_k <- w_k - 0.5 * 1 * (w_k - theta) = [1.065, -1.935 | 0.565];  mean data loss = (0.25 + 0.04) / 2
    assert loss == pytest.approx(0.145)
    deployed = trainer.deployed(list)
    np.testing.assert_allclose(deployed["weight"], [[1.13, -1.87]])
    np.testing.assert_allclose(deployed["bias"], [0.63])
    envelope = trainer.learner.envelope
    np.testing.assert_allclose(envelope.anchor["weight"].numpy(), [[1.065, -1.935]])
    np.testing.assert_allclose(envelope.anchor["bias"].numpy(), [0.565])


def test_negative_lambda_is_rejected():
    with pytest.raises(ValueError, match="pfedme-lambda = -1"):
        MoreauEnvelope(linear([0.0, 0.0], 0.0), -1.0)
