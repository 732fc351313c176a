"""Precision of local training: resolution of the setting, the float16 scaler logic, bf16 autocast on the CPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedsm_core.algorithms.baselines.global_client import GlobalClientOptions, train_global_client
from fedsm_core.algorithms.fedsm.client import train_fedsm_client
from fedsm_core.algorithms.fedsm.fedsm import FedSMPayload
from fedsm_core.algorithms.personalization.settings import PersonalizationSettings
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.training.local_update import Learner, TrainingHook, train_local
from fedsm_core.training.precision import FP32, StepPrecision, resolve_precision, step_precision

SPEC = ModelSpec("mobilenet_v2", num_structures=2, num_sites=3, selector_width=4)


class Scale(nn.Module):
    """``y = w * x`` with one float32 parameter."""

    def __init__(self, w: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x


def squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((outputs - targets) ** 2).sum()


class FakeScaler:
    """Records calls like :class:`torch.amp.GradScaler`; ``overflow`` makes ``step`` skip the optimizer."""

    def __init__(self, scale: float, overflow: bool = False) -> None:
        self.scale_value, self.overflow, self.calls = scale, overflow, []

    def scale(self, loss):
        self.calls.append("scale")
        return loss * self.scale_value

    def unscale_(self, optimizer):
        self.calls.append("unscale_")
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                parameter.grad.div_(self.scale_value)

    def get_scale(self):
        return self.scale_value

    def step(self, optimizer):
        self.calls.append("step")
        if not self.overflow:
            optimizer.step()

    def update(self):
        self.calls.append("update")


class GradientLog(TrainingHook):
    """Keeps the gradient each hook point saw, and the scaler's calls made before it."""

    def __init__(self, scaler: FakeScaler) -> None:
        self.scaler, self.seen = scaler, []

    def after_backward(self, model):
        self.seen.append(("after_backward", float(model.w.grad), list(self.scaler.calls)))


@pytest.mark.parametrize(
    ("name", "expected"), [("auto", "fp32"), ("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16")]
)
def test_precision_on_the_cpu_resolves_auto_to_fp32(name, expected):
    assert resolve_precision(name, "cpu") == expected


def test_unknown_precision_is_named():
    with pytest.raises(ValueError, match=r"precision = 'fp8' is not one of \['auto', 'fp32', 'bf16', 'fp16'\]"):
        resolve_precision("fp8", "cpu")


def test_fp32_needs_no_autocast_and_no_scaler():
    assert step_precision("fp32", "cpu") is FP32 and step_precision("auto", "cpu") is FP32
    bf16 = step_precision("bf16", "cpu")
    assert bf16.dtype == torch.bfloat16 and bf16.scaler is None
    fp16 = step_precision("fp16", "cpu")
    assert fp16.dtype == torch.float16 and isinstance(fp16.scaler, torch.amp.GradScaler)
    assert step_precision("fp16", "cpu").scaler is not fp16.scaler  # one scaler per learner


def test_scaled_step_unscales_before_hooks_and_steps_through_the_scaler():
    # Prepare
    # w = 2, x = 1, target 0: loss = 4, dloss/dw = 2 w x^2 = 4; the scaled backward gives 1024 * 4 = 4096
    scaler = FakeScaler(1024.0)
    model = Scale(2.0)
    log = GradientLog(scaler)
    learner = Learner("m", model, torch.optim.SGD(model.parameters(), lr=0.1), squared_error, hooks=[log])

    # Execute
    loss = learner.step(torch.ones(1), torch.zeros(1), StepPrecision("cpu", None, scaler))

    # Assert
    assert float(loss) == 4.0  # the data loss, not the scaled one
    assert log.seen == [("after_backward", 4.0, ["scale", "unscale_"])]  # hooks see the true gradient
    assert scaler.calls == ["scale", "unscale_", "step", "update"]
    assert float(model.w.detach()) == pytest.approx(2.0 - 0.1 * 4.0)  # w - lr * g = 1.6


def test_overflowed_step_leaves_the_weights_and_still_updates_the_scale():
    # Prepare
    scaler = FakeScaler(1024.0, overflow=True)
    model = Scale(2.0)
    learner = Learner("m", model, torch.optim.SGD(model.parameters(), lr=0.1), squared_error)

    # Execute
    learner.step(torch.ones(1), torch.zeros(1), StepPrecision("cpu", None, scaler))

    # Assert
    assert float(model.w.detach()) == 2.0
    assert scaler.calls[-2:] == ["step", "update"]


def test_gradients_outside_the_optimizer_are_unscaled_too():
    # Prepare: APFL's alpha is stepped by a hook, not by the optimizer; its gradient must be true-sized
    scaler = FakeScaler(8.0)
    model = Scale(2.0)
    model.alpha = nn.Parameter(torch.tensor(3.0))
    model.forward = lambda x: model.w * model.alpha * x  # loss = (6 x)^2; d/d alpha = 2 * 6 * w = 24
    optimizer = torch.optim.SGD([model.w], lr=0.0)

    # Execute
    precision = StepPrecision("cpu", None, scaler)
    Learner("m", model, optimizer, squared_error).step(torch.ones(1), torch.zeros(1), precision)

    # Assert
    assert float(model.alpha.grad) == 24.0


def test_fp16_with_a_real_scaler_trains_on_the_cpu():
    # Prepare
    model = Scale(2.0)
    learner = Learner("m", model, torch.optim.SGD(model.parameters(), lr=0.01), squared_error)

    # Execute
    metrics = train_local([learner], lambda: [(torch.ones(1), torch.zeros(1))] * 5, epochs=1, precision="fp16")

    # Assert
    assert metrics["steps"] == 5.0 and np.isfinite(metrics["loss-m"])
    assert model.w.dtype == torch.float32 and 0.0 < float(model.w.detach()) <= 2.0  # skipped or descending steps only


def _site_data(count: int = 6, size: int = 32) -> SegArrays:
    rng = np.random.default_rng(0)
    return SegArrays(rng.random((count, 3, size, size), dtype=np.float32),
                     (rng.random((count, 2, size, size)) > 0.5).astype(np.float32),
                     tuple(f"x/{i}" for i in range(count)))


def _settings(**changes) -> RoundSettings:
    base = RoundSettings(batch_size=3, local_epochs=1, max_local_steps=0, lr=1e-3, selector_lr=1e-3, seed=0,
                         precision="bf16")
    return dataclasses.replace(base, **changes)


def _assert_float32_weights(weights: dict[str, np.ndarray], before: dict[str, np.ndarray]) -> None:
    for key, value in weights.items():
        assert value.dtype == before[key].dtype, key  # float32 stays float32, integer buffers stay integers
        assert np.all(np.isfinite(value)), key
    assert any(not np.array_equal(weights[k], before[k]) for k in before if before[k].dtype.kind == "f")


# softpull takes the loop's plain step (here with HarmoFL's perturbation); Per-FedAvg has a step of its own
@pytest.mark.parametrize(("method", "alpha"), [("softpull", 0.05), ("perfedavg", 0.0)])
def test_bf16_fedsm_round_on_the_cpu_runs_in_bfloat16_and_sends_float32(method, alpha):
    # Prepare: one step of each learner (HarmoFL's weight perturbation with FedSM's own personalization)
    torch.manual_seed(0)
    segmentation, selector = get_weights(SPEC.build_segmentation()), get_weights(SPEC.build_selector())
    personal = PersonalizationSettings(method=method, pfedme_k=2)
    settings = _settings(personalization=personal, perturbation_alpha=alpha, max_local_steps=1)
    seen: list[torch.dtype] = []
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: seen.append(output.dtype) if isinstance(module, nn.Conv2d) else None)

    # Execute
    try:
        update, metrics = train_fedsm_client(FedSMPayload(segmentation, segmentation, selector, {}), 1,
                                             _site_data(), SPEC, settings, torch.device("cpu"))
    finally:
        hook.remove()

    # Assert
    assert torch.bfloat16 in seen  # the convolutions ran under autocast
    assert all(np.isfinite(value) for key, value in metrics.items())
    _assert_float32_weights(update.global_weights, segmentation)
    _assert_float32_weights(update.personal_weights, segmentation)
    _assert_float32_weights(update.selector_weights, selector)
    assert all(value.dtype == np.float32 for value in update.selector_optimizer.values() if value.dtype.kind == "f")


def test_bf16_round_with_proximal_term_and_control_variates_on_the_cpu_sends_float32():
    # Prepare: FedProx's extra loss and SCAFFOLD's gradient correction in one learner
    torch.manual_seed(0)
    weights = get_weights(SPEC.build_segmentation())
    zeros = {k: np.zeros_like(v) for k, v in weights.items() if v.dtype.kind == "f"}
    options = GlobalClientOptions(proximal_mu=0.01, server_control=zeros, client_control=zeros)

    # Execute
    update, metrics = train_global_client(weights, _site_data(), SPEC, _settings(max_local_steps=1), options,
                                          torch.device("cpu"))

    # Assert
    assert np.isfinite(metrics["loss-global"])
    _assert_float32_weights(update.weights, weights)
    assert all(value.dtype == np.float32 for value in update.client_control.values())


def test_bf16_loss_matches_the_fp32_loss_up_to_bfloat16_rounding():
    # Prepare: the first step's loss is computed on the same weights and batch in both runs
    torch.manual_seed(0)
    weights = get_weights(SPEC.build_segmentation())
    losses = {}

    # Execute
    for precision in ("fp32", "bf16"):
        settings = _settings(precision=precision, max_local_steps=1)
        _, metrics = train_global_client(weights, _site_data(), SPEC, settings, GlobalClientOptions(),
                                         torch.device("cpu"))
        losses[precision] = metrics["loss-global"]

    # Assert: bfloat16 keeps 8 significant bits (relative rounding 2^-8 ~ 0.4 %) per operation
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.02)
    assert losses["bf16"] != losses["fp32"]  # autocast did change the arithmetic
