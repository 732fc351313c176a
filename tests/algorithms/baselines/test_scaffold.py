"""SCAFFOLD: corrected local gradients, option II control variates, reductions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedsm_core.algorithms.aggregation import weighted_average
from fedsm_core.algorithms.baselines.scaffold import ScaffoldCorrection, update_server_control, zero_controls
from fedsm_core.models.weights import get_weights, set_weights
from fedsm_core.training.local_update import Learner, train_local

LR = 0.1


def _model() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(3, 1).double()


def _client_data(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(8, 3, generator=generator, dtype=torch.float64)
    targets = torch.randn(8, 1, generator=generator, dtype=torch.float64) + seed
    return [(inputs[:4], targets[:4]), (inputs[4:], targets[4:])]


def _local_round(start, data, hook=None):
    model = _model()
    set_weights(model, start)
    hooks = [] if hook is None else [hook]
    learner = Learner("m", model, torch.optim.SGD(model.parameters(), lr=LR), nn.functional.mse_loss, hooks=hooks)
    train_local([learner], lambda: data, epochs=1)
    return model


def test_scaffold_with_zero_control_variates_equals_fedavg_for_one_round():
    # Prepare
    start = get_weights(_model())
    zeros = zero_controls(_model())

    # Execute
    fedavg = weighted_average([get_weights(_local_round(start, _client_data(s))) for s in (1, 2)], [1, 1])
    scaffold = weighted_average(
        [get_weights(_local_round(start, _client_data(s), ScaffoldCorrection(zeros, zeros))) for s in (1, 2)], [1, 1]
    )

    # Assert
    for key in fedavg:
        np.testing.assert_array_equal(fedavg[key], scaffold[key])


def test_corrected_step_follows_g_minus_ck_plus_c():
    # Prepare: one SGD step, c = 1 and c_k = 3 everywhere -> correction -2
    start = get_weights(_model())
    controls = zero_controls(_model())
    server = {k: np.ones_like(v) for k, v in controls.items()}
    client = {k: np.full_like(v, 3.0) for k, v in controls.items()}
    data = _client_data(1)[:1]

    # Execute
    plain = get_weights(_local_round(start, data))
    corrected = get_weights(_local_round(start, data, ScaffoldCorrection(server, client)))

    # Assert: y = x - lr (g - 2) = plain + 2 lr
    for key in ("weight", "bias"):
        np.testing.assert_allclose(corrected[key], plain[key] + 2 * LR, rtol=1e-12)


def test_new_client_control_is_option_two():
    # Prepare: c = 0.5, c_k = 0.2 everywhere, plain SGD
    start = get_weights(_model())
    controls = zero_controls(_model())
    server = {k: np.full_like(v, 0.5) for k, v in controls.items()}
    client = {k: np.full_like(v, 0.2) for k, v in controls.items()}
    hook = ScaffoldCorrection(server, client)

    # Execute
    model = _local_round(start, _client_data(3), hook)
    new_control = hook.new_client_control(model)

    # Assert: option II, c_k+ = c_k - c + (x - y) / (S * lr) with S = 2 steps
    end = get_weights(model)
    for key in ("weight", "bias"):
        option_two = client[key] - server[key] + (start[key] - end[key]) / (2 * LR)
        np.testing.assert_allclose(new_control[key], option_two, rtol=1e-5, atol=1e-6)


def test_server_control_moves_by_the_mean_delta_over_all_clients():
    # c = 1;  deltas of 2 of N = 4 clients: 4 and 8 -> c = 1 + (4 + 8) / 4 = 4
    server = {"w": np.array([1.0], np.float32)}
    updated = update_server_control(server, [{"w": np.array([4.0])}, {"w": np.array([8.0])}], num_clients=4)
    np.testing.assert_allclose(updated["w"], [4.0])


def test_mismatched_control_variates_are_rejected():
    with pytest.raises(ValueError, match="differ"):
        ScaffoldCorrection({"a": np.zeros(1)}, {"b": np.zeros(1)})
