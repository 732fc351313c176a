"""Tests of the transport of Adam moments as named arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedsm_core.training.optimizer_state import adam_state_to_arrays, load_adam_state


def _batches(seed: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 3, generator=generator), torch.randn(5, 2, generator=generator)) for _ in range(count)]


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, batch) -> None:
    inputs, targets = batch
    optimizer.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(inputs), targets).backward()
    optimizer.step()


def test_round_trip_reproduces_the_next_step_exactly():
    # Prepare
    torch.manual_seed(0)
    batches = _batches(seed=1, count=3)
    reference = nn.Linear(3, 2)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    for batch in batches[:2]:
        _step(reference, reference_optimizer, batch)
    exported = adam_state_to_arrays(reference, reference_optimizer)
    resumed = nn.Linear(3, 2)
    resumed.load_state_dict(reference.state_dict())
    resumed_optimizer = torch.optim.Adam(resumed.parameters(), lr=0.01)

    # Execute
    load_adam_state(resumed, resumed_optimizer, exported)
    _step(reference, reference_optimizer, batches[2])
    _step(resumed, resumed_optimizer, batches[2])

    # Assert
    for (name, expected), (_, actual) in zip(reference.named_parameters(), resumed.named_parameters(), strict=True):
        assert torch.equal(expected, actual), name
    after = adam_state_to_arrays(resumed, resumed_optimizer)
    for key, value in adam_state_to_arrays(reference, reference_optimizer).items():
        np.testing.assert_array_equal(after[key], value)
    assert float(after["weight/step"]) == 3.0


def test_export_layout_after_steps():
    # Prepare
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    _step(model, optimizer, _batches(seed=2, count=1)[0])
    _step(model, optimizer, _batches(seed=3, count=1)[0])

    # Execute
    arrays = adam_state_to_arrays(model, optimizer)

    # Assert
    assert set(arrays) == {
        f"{name}/{key}" for name in ("weight", "bias") for key in ("exp_avg", "exp_avg_sq", "step")
    }
    assert arrays["weight/exp_avg"].shape == (2, 3)
    assert arrays["bias/exp_avg_sq"].shape == (2,)
    assert float(arrays["weight/step"]) == 2.0
    assert np.any(arrays["weight/exp_avg"] != 0)
    # the export is a copy: editing it does not touch the optimizer
    arrays["weight/exp_avg"][:] = 123.0
    assert not torch.any(optimizer.state[model.weight]["exp_avg"] == 123.0)


def test_fresh_optimizer_exports_zeros_and_step_zero():
    # Prepare
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())

    # Execute
    arrays = adam_state_to_arrays(model, optimizer)

    # Assert
    for name, parameter in model.named_parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            assert arrays[f"{name}/{key}"].shape == tuple(parameter.shape)
            assert not np.any(arrays[f"{name}/{key}"])
        assert float(arrays[f"{name}/step"]) == 0.0


def test_loading_a_fresh_export_leaves_the_optimizer_fresh():
    # Prepare
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    fresh = adam_state_to_arrays(nn.Linear(3, 2), torch.optim.Adam(nn.Linear(3, 2).parameters()))

    # Execute
    load_adam_state(model, optimizer, fresh)
    load_adam_state(model, optimizer, {})

    # Assert
    assert len(optimizer.state) == 0


def test_missing_keys_raise():
    # Prepare
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    arrays = adam_state_to_arrays(model, optimizer)
    del arrays["bias/exp_avg_sq"]

    # Execute / Assert
    with pytest.raises(ValueError, match=r"optimizer state lacks \['bias/exp_avg_sq'\]"):
        load_adam_state(model, optimizer, arrays)


def test_state_of_another_model_raises():
    # Prepare
    other = nn.Sequential(nn.Linear(3, 2))
    arrays = adam_state_to_arrays(other, torch.optim.Adam(other.parameters()))
    model = nn.Linear(3, 2)

    # Execute / Assert
    with pytest.raises(ValueError, match="does not belong to this model"):
        load_adam_state(model, torch.optim.Adam(model.parameters()), arrays)


def test_float64_moments_stay_float64_and_the_next_step_runs():
    # Prepare
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3, dtype=torch.float64)).sum().backward()
    optimizer.step()
    restored = torch.nn.Linear(3, 2).double()
    restored_optimizer = torch.optim.Adam(restored.parameters())

    # Execute
    load_adam_state(restored, restored_optimizer, adam_state_to_arrays(model, optimizer))
    restored(torch.randn(4, 3, dtype=torch.float64)).sum().backward()
    restored_optimizer.step()

    # Assert
    assert restored_optimizer.state[restored.weight]["exp_avg"].dtype == torch.float64
