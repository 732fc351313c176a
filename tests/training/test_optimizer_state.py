"""Tests of the sites' Adam (fused where torch has the kernel) and the transport of its moments as named arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedsm_core.training.optimizer_state import adam_state_to_arrays, load_adam_state, new_adam


def _batches(seed: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 3, generator=generator), torch.randn(5, 2, generator=generator)) for _ in range(count)]


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, batch) -> None:
    inputs, targets = batch
    optimizer.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(inputs), targets).backward()
    optimizer.step()


def _looped_adam(parameters, lr: float) -> torch.optim.Adam:
    """torch's reference implementation: a loop over the parameters, one tensor at a time."""
    return torch.optim.Adam(parameters, lr=lr, foreach=False, fused=False)


def test_new_adam_uses_the_fused_kernel_for_cpu_parameters_and_the_default_elsewhere():
    assert new_adam(nn.Linear(3, 2).parameters(), 0.01).defaults["fused"] is True
    assert not new_adam(nn.Linear(3, 2, device="meta").parameters(), 0.01).defaults["fused"]


def test_the_first_fused_step_moves_each_weight_by_lr_times_the_sign_of_its_gradient():
    # Prepare: after one step m / (1 - b1) = g and v / (1 - b2) = g^2, so w1 = w0 - lr * g / (|g| + eps)
    weight = nn.Parameter(torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64))
    gradient = torch.tensor([3.0, -0.25, 1e-3], dtype=torch.float64)
    optimizer = new_adam([weight], lr=0.1)

    # Execute
    weight.grad = gradient.clone()
    optimizer.step()

    # Assert (float64, by hand: 0.5 - 0.1 * 3 / (3 + 1e-8), ...)
    expected = [0.5 - 0.1 * 3.0 / (3.0 + 1e-8), -1.0 + 0.1 * 0.25 / (0.25 + 1e-8), 2.0 - 0.1 * 1e-3 / (1e-3 + 1e-8)]
    np.testing.assert_allclose(weight.detach().numpy(), expected, rtol=0, atol=1e-15)


def test_the_fused_adam_follows_torchs_looped_adam_up_to_floating_point_order():
    # Prepare: the same model and batches, stepped by each implementation
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [new_adam(models[0].parameters(), 0.01), _looped_adam(models[1].parameters(), 0.01)]

    # Execute
    for batch in _batches(seed=4, count=20):
        for model, optimizer in zip(models, optimizers, strict=True):
            _step(model, optimizer, batch)

    # Assert: the same trajectory within float32 rounding (a different update rule would be off by ~lr)
    for (name, fused), (_, looped) in zip(*(model.named_parameters() for model in models), strict=True):
        torch.testing.assert_close(fused, looped, rtol=1e-5, atol=1e-6, msg=name)


class _ChannelsLastConv(nn.Module):
    """A 2x2 convolution with channels-last weights (as the U-Nets are built) on ``[N, 3]`` inputs.

    Its ``[2, 3, 2, 2]`` weight lies in memory in another order than a contiguous one (a 1x1 kernel would not).
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, kernel_size=2).to(memory_format=torch.channels_last)
        self.register_buffer("pattern", torch.tensor([[1.0, -1.0], [0.5, 2.0]]))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.conv(inputs[:, :, None, None] * self.pattern).flatten(1)


@pytest.mark.parametrize("make_adam", [_looped_adam, new_adam], ids=["looped", "fused"])
@pytest.mark.parametrize("make_model", [lambda: nn.Linear(3, 2), _ChannelsLastConv], ids=["linear", "channels-last"])
def test_round_trip_reproduces_the_next_step_exactly(make_adam, make_model):
    # Prepare
    torch.manual_seed(0)
    batches = _batches(seed=1, count=3)
    reference = make_model()
    reference_optimizer = make_adam(reference.parameters(), 0.01)
    for batch in batches[:2]:
        _step(reference, reference_optimizer, batch)
    exported = adam_state_to_arrays(reference, reference_optimizer)
    resumed = make_model()
    resumed.load_state_dict(reference.state_dict())
    resumed_optimizer = make_adam(resumed.parameters(), 0.01)

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
    assert {float(value) for key, value in after.items() if key.endswith("/step")} == {3.0}


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
