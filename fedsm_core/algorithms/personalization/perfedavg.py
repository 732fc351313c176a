"""Per-FedAvg, first-order version (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020), in FedSM.

Per-FedAvg trains a meta-model ``theta`` whose one-step adaptation
``theta - alpha * grad f_k(theta)`` fits each site (Eq. 3 of the paper). Its
first-order (FO) local step on two independent batches ``D`` and ``D'`` is::

    theta_tmp = theta - alpha * grad f_k(theta; D)            (inner, adaptation)
    theta    <- theta - beta * grad f_k(theta_tmp; D')         (outer, FO-MAML)

In FedSM the global model stays FedAvg-trained, so Per-FedAvg runs as the
personalized learner: each round it starts its meta-model from the received
global model ``w`` (Per-FedAvg's meta-model *is* the federated model), takes
one FO step per minibatch with the first half of the minibatch as ``D`` and
the second half as ``D'`` (a single-image batch serves as both), with the
run's optimizer in place of the outer SGD step ``beta``, and deploys

    v_k = theta - alpha * grad f_k(theta; D_train),

the meta-model after the local epochs adapted with ``perfedavg-steps``
gradient steps on the whole local training split (gradient averaged over its
images, no augmentation). The server keeps each reply as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

import torch
import torch.nn as nn

from fedsm_core.algorithms.personalization.base import Batches, PersonalStart, PersonalTrainer
from fedsm_core.models.weights import Weights, get_weights
from fedsm_core.training.local_update import Learner, LossFn
from fedsm_core.training.precision import FP32, StepPrecision


def split_batch(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """``(D, D')``: the first and second half of a minibatch; one image serves as both."""
    if len(inputs) < 2:
        return (inputs, targets), (inputs, targets)
    half = len(inputs) // 2
    return (inputs[:half], targets[:half]), (inputs[half:], targets[half:])


def sgd_steps(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn, alpha: float,
              steps: int) -> None:
    """``theta <- theta - alpha * grad f(theta; D)``, ``steps`` times, in place (``.grad`` untouched)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(steps):
        gradients = torch.autograd.grad(loss_fn(model(inputs), targets), params)
        with torch.no_grad():
            for parameter, gradient in zip(params, gradients, strict=True):
                parameter.sub_(alpha * gradient)


def split_gradient_step(model: nn.Module, batches: Batches, loss_fn: LossFn, alpha: float) -> None:
    """One step ``theta <- theta - alpha * grad f(theta; D_train)`` over all batches.

    Each batch's mean-loss gradient is weighted by its share of the images, so
    the step uses the gradient of the mean loss over the whole split.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    pairs = list(batches())
    total = sum(len(images) for images, _ in pairs)
    if total == 0:
        return
    device = params[0].device
    sums = [torch.zeros_like(p) for p in params]
    for images, masks in pairs:
        loss = loss_fn(model(images.to(device)), masks.to(device))
        for accumulated, gradient in zip(sums, torch.autograd.grad(loss, params), strict=True):
            accumulated.add_(gradient, alpha=len(images) / total)
    with torch.no_grad():
        for parameter, gradient in zip(params, sums, strict=True):
            parameter.sub_(alpha * gradient)


@dataclasses.dataclass
class FOMAMLLearner(Learner):
    """A learner whose step is Per-FedAvg's first-order meta-step.

    The gradient of the outer loss is taken at the adapted weights
    ``theta_tmp``, then the weights are restored to ``theta`` and the run's
    optimizer applies that gradient to them. ``alpha`` is the inner step size
    and ``inner_steps`` the number of inner steps on ``D``.
    """

    alpha: float = 0.01
    inner_steps: int = 1

    def step(self, images: torch.Tensor, masks: torch.Tensor, precision: StepPrecision = FP32) -> torch.Tensor:
        """One FO-MAML step on one minibatch; returns the outer loss ``f(theta_tmp; D')``.

        The outer loss runs under ``precision``; the inner steps too, except
        under a gradient scaler (float16), where their unscaled gradients
        could flush to zero and they run in float32 instead.
        """
        self.model.train()
        inputs, targets = self.batch_fn(images, masks)
        (inner_x, inner_y), (outer_x, outer_y) = split_batch(inputs, targets)
        params = [p for p in self.model.parameters() if p.requires_grad]
        meta = [p.detach().clone() for p in params]
        with precision.autocast() if precision.scaler is None else contextlib.nullcontext():
            sgd_steps(self.model, inner_x, inner_y, self.loss_fn, self.alpha, self.inner_steps)
        self.optimizer.zero_grad(set_to_none=True)
        with precision.autocast():
            loss = self.loss_fn(self.model(outer_x), outer_y)
        precision.backward(loss)
        _restore(params, meta)
        precision.unscale(self.model, self.optimizer)
        precision.step(self.optimizer)
        return loss.detach()


def _restore(params: Sequence[nn.Parameter], values: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for parameter, value in zip(params, values, strict=True):
            parameter.copy_(value)


class PerFedAvgTrainer(PersonalTrainer):
    """Deploys the meta-model adapted on the whole local training split."""

    def deployed(self, batches: Batches) -> Weights:
        """``theta - alpha * grad f_k(theta; D_train)``, ``perfedavg-steps`` times."""
        learner = self.learner
        learner.model.train()
        for _ in range(learner.inner_steps):
            split_gradient_step(learner.model, batches, learner.loss_fn, learner.alpha)
        return get_weights(learner.model)


def start_perfedavg(start: PersonalStart) -> PerFedAvgTrainer:
    """Per-FedAvg (FO): the meta-model starts from the received global model each round."""
    settings = start.settings
    if settings.perfedavg_alpha <= 0 or settings.perfedavg_steps < 1:
        raise ValueError(f"Per-FedAvg needs perfedavg-alpha > 0 and perfedavg-steps >= 1, got "
                         f"{settings.perfedavg_alpha} and {settings.perfedavg_steps}")
    model = start.model_from(start.global_weights, "global model")
    learner = FOMAMLLearner("personal", model, start.optimizer(model.parameters()), start.loss_fn,
                            alpha=settings.perfedavg_alpha, inner_steps=settings.perfedavg_steps)
    return PerFedAvgTrainer(learner)
