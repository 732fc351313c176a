"""Tests of the shared local-training loop and its hooks."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedsm_core.data.arrays import SegArrays
from fedsm_core.training.local_update import (
    Learner,
    TrainingHook,
    segmentation_batch,
    stretch_to_min_steps,
    train_local,
    train_on_split,
)


class Scale(nn.Module):
    """``y = w * x`` with a single float64 parameter ``w``."""

    def __init__(self, w: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x


def squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((outputs - targets) ** 2).sum()


class Recorder(TrainingHook):
    """Logs every hook call with the learner's tag and the weight it saw."""

    def __init__(self, tag: str, log: list) -> None:
        self.tag = tag
        self.log = log

    def extra_loss(self, model):
        self.log.append((self.tag, "extra_loss", model.w.item()))
        return None

    def after_backward(self, model):
        self.log.append((self.tag, "after_backward", model.w.grad.item()))

    def after_step(self, model):
        self.log.append((self.tag, "after_step", model.w.item()))


def _learner(name: str, w: float = 1.0, lr: float = 0.0, hooks=(), log=None) -> Learner:
    model = Scale(w)
    hooks = tuple(hooks) + ((Recorder(name, log),) if log is not None else ())
    return Learner(name, model, torch.optim.SGD(model.parameters(), lr=lr), squared_error, hooks=hooks)


def _batches(count: int, calls: list | None = None):
    def make():
        if calls is not None:
            calls.append(1)
        for index in range(count):
            yield torch.full((1, 1), float(index + 1), dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64)

    return make


def test_every_learner_steps_on_every_batch_in_order():
    # Prepare
    log: list = []
    calls: list = []
    learners = [_learner("global", log=log), _learner("personal", log=log), _learner("selector", log=log)]

    # Execute
    metrics = train_local(learners, _batches(3, calls), epochs=2)

    # Assert
    steps = [tag for tag, event, _ in log if event == "after_step"]
    assert steps == ["global", "personal", "selector"] * 6
    assert metrics["steps"] == 6.0
    assert len(calls) == 2  # a fresh iterable per epoch
    # lr = 0 keeps w = 1; the data losses are x^2 for x = 1, 2, 3 -> mean (1 + 4 + 9) / 3 = 14/3
    for name in ("global", "personal", "selector"):
        assert metrics[f"loss-{name}"] == pytest.approx(14.0 / 3.0)


@pytest.mark.parametrize(("epochs", "max_steps", "expected"), [(1, 2, 2), (3, 4, 4), (2, 0, 6), (1, 10, 3)])
def test_max_steps_caps_the_number_of_minibatches(epochs, max_steps, expected):
    # Prepare
    log: list = []
    learners = [_learner("a", log=log), _learner("b", log=log)]

    # Execute
    metrics = train_local(learners, _batches(3), epochs=epochs, max_steps=max_steps)

    # Assert
    assert metrics["steps"] == float(expected)
    assert sum(1 for tag, event, _ in log if event == "after_step" and tag == "a") == expected
    assert sum(1 for tag, event, _ in log if event == "after_step" and tag == "b") == expected


@pytest.mark.parametrize(("count", "epochs", "max_steps", "min_steps", "expected"), [
    (12, 1, 0, 8, (4, 8)),  # 2 minibatches a pass (12 = 8 + 4): 4 passes of 2
    (12, 1, 0, 0, (1, 0)),  # no minimum: unchanged
    (100, 1, 0, 8, (1, 0)),  # 13 minibatches a pass already: unchanged
    (64, 1, 0, 8, (1, 0)),  # exactly 8 a pass: unchanged
    (9, 1, 0, 8, (8, 8)),  # 9 images in batches of 8 make one batch (the ninth joins it): 8 passes of 1
    (12, 2, 3, 8, (4, 8)),  # a cap below the minimum (3 steps) is stretched too
    (40, 1, 0, 8, (2, 8)),  # 5 a pass: 2 passes, capped at 8
])
def test_a_round_shorter_than_min_steps_is_stretched_to_exactly_min_steps(count, epochs, max_steps, min_steps,
                                                                         expected):
    assert stretch_to_min_steps(count, 8, epochs, max_steps, min_steps) == expected


def test_train_on_split_takes_min_steps_at_a_small_site_and_its_pass_at_a_large_one():
    def data(count):
        images = torch.rand(count, 1, 4, 4, generator=torch.Generator().manual_seed(count)).numpy()
        return SegArrays(images, (images > 0.5).astype("float32"), tuple(str(i) for i in range(count)))

    def steps(count, min_steps):
        model = nn.Conv2d(1, 1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        learner = Learner("a", model, optimizer, lambda out, y: (out - y).pow(2).mean())
        return train_on_split([learner], data(count), 4, 1, 0, 0, augmentation="none", min_steps=min_steps)["steps"]

    assert (steps(6, 0), steps(6, 5), steps(40, 5)) == (2.0, 5.0, 10.0)


def test_max_steps_loss_is_the_mean_over_taken_steps():
    # Prepare
    learners = [_learner("a")]

    # Execute
    # two steps on x = 1 and x = 2 with w = 1 (lr = 0): losses 1 and 4 -> mean 2.5
    metrics = train_local(learners, _batches(3), epochs=1, max_steps=2)

    # Assert
    assert metrics["loss-a"] == 2.5


class Proximal(TrainingHook):
    """``mu/2 * (w - w0)^2``, FedProx-style."""

    def __init__(self, mu: float, w0: float) -> None:
        self.mu = mu
        self.w0 = w0

    def extra_loss(self, model):
        return 0.5 * self.mu * (model.w - self.w0) ** 2


def test_extra_loss_adds_to_the_gradient():
    # Prepare
    # w = 1.5, x = 2, y = 0: data loss (w x - y)^2 = 9, d/dw = 2 (w x - y) x = 2 * 3 * 2 = 12
    # extra = mu/2 (w - w0)^2 with mu = 4, w0 = 0.5: d/dw = mu (w - w0) = 4 * 1 = 4
    # gradient 12 + 4 = 16; SGD with lr = 0.125: w <- 1.5 - 0.125 * 16 = -0.5
    log: list = []
    learner = _learner("p", w=1.5, lr=0.125, hooks=(Proximal(mu=4.0, w0=0.5),), log=log)
    batch = [(torch.tensor([[2.0]], dtype=torch.float64), torch.tensor([[0.0]], dtype=torch.float64))]

    # Execute
    metrics = train_local([learner], lambda: batch, epochs=1)

    # Assert
    assert [(event, value) for _, event, value in log] == [
        ("extra_loss", 1.5),
        ("after_backward", 16.0),
        ("after_step", -0.5),
    ]
    assert learner.model.w.item() == -0.5
    assert metrics["loss-p"] == 9.0  # the reported loss is the data loss only


class OverrideGradient(TrainingHook):
    def __init__(self, value: float) -> None:
        self.value = value

    def after_backward(self, model):
        model.w.grad.fill_(self.value)


def test_after_backward_can_edit_gradients():
    # Prepare
    # the data gradient (12) is replaced by 10: w <- 1.5 - 0.125 * 10 = 0.25
    learner = _learner("s", w=1.5, lr=0.125, hooks=(OverrideGradient(10.0),))
    batch = [(torch.tensor([[2.0]], dtype=torch.float64), torch.tensor([[0.0]], dtype=torch.float64))]

    # Execute
    train_local([learner], lambda: batch, epochs=1)

    # Assert
    assert learner.model.w.item() == 0.25


def test_learner_step_uses_batch_fn_and_train_mode():
    # Prepare
    # batch_fn keeps x and returns the target 3 x, so with w = 1 and x = 2 the loss is (2 - 6)^2 = 16
    model = Scale(1.0)
    model.eval()
    learner = Learner(
        "sel", model, torch.optim.SGD(model.parameters(), lr=0.0), squared_error,
        batch_fn=lambda images, masks: (images, 3 * images),
    )

    # Execute
    loss = learner.step(torch.tensor([[2.0]], dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64))

    # Assert
    assert loss == 16.0
    assert model.training
    images, masks = torch.zeros(2), torch.ones(2)
    assert segmentation_batch(images, masks) == (images, masks)


def test_no_learners_raises():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="no learners"):
        train_local([], _batches(1), epochs=1)
