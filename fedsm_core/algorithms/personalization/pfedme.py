"""pFedMe (T. Dinh, Tran & Nguyen, NeurIPS 2020) as FedSM's personalized-model trainer.

pFedMe's personalized model is the Moreau-envelope solution around the local
model ``w_k`` (Eq. 3 of the paper)::

    theta_k(w_k) = argmin_theta  f_k(theta) + lambda / 2 * ||theta - w_k||^2

On each minibatch ``xi`` the site solves this approximately with ``K`` steps
on ``f_k(theta; xi) + lambda / 2 * ||theta - w_k||^2`` (warm-started from the
previous ``theta``), then moves its local model toward the solution
(Algorithm 1, local update)::

    w_k <- w_k - eta * lambda * (w_k - theta_k)

In FedSM the global model stays FedAvg-trained by the global learner, so
``w_k`` here is the personalized learner's own copy: like ``theta_k`` it starts
each round from the received global model (pFedMe's clients load the server
model into both), and it is dropped after the round, since the server does
not aggregate it. The deployed personalized model is ``theta_k``; the server
keeps each reply as it is. The ``K`` inner steps use the run's optimizer (pFedMe
uses plain gradient steps with a personal learning rate).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from fedsm_core.algorithms.baselines.fedprox import ProximalTerm
from fedsm_core.algorithms.personalization.base import PersonalStart, PersonalTrainer
from fedsm_core.training.local_update import Learner
from fedsm_core.training.precision import FP32, StepPrecision


class MoreauEnvelope(ProximalTerm):
    """``lambda / 2 * ||theta - w_k||^2`` whose anchor ``w_k`` follows ``theta``.

    Parameters
    ----------
    local_model : nn.Module
        Its parameters at construction are the initial ``w_k``.
    lam : float
        pFedMe's ``lambda >= 0``.
    """

    def __init__(self, local_model: nn.Module, lam: float) -> None:
        if lam < 0:
            raise ValueError(f"pfedme-lambda = {lam} must be >= 0")
        super().__init__(local_model, lam)

    def pull_anchor(self, model: nn.Module, eta: float) -> None:
        """``w_k <- w_k - eta * lambda * (w_k - theta)`` for every parameter of ``theta = model``."""
        with torch.no_grad():
            for name, theta in model.named_parameters():
                anchor = self.anchor[name]
                anchor.sub_(eta * self.mu * (anchor - theta.detach()))


@dataclasses.dataclass
class PFedMeLearner(Learner):
    """``K`` optimizer steps on ``f(theta) + lambda/2 ||theta - w_k||^2``, then the ``w_k`` update.

    ``hooks`` must hold ``envelope`` (its ``extra_loss`` is the proximal term).
    """

    envelope: MoreauEnvelope | None = None
    inner_steps: int = 5
    eta: float = 0.005

    def step(self, images: torch.Tensor, masks: torch.Tensor, precision: StepPrecision = FP32) -> torch.Tensor:
        """One pFedMe local step on one minibatch; returns the mean data loss of the inner steps."""
        if self.envelope is None or self.envelope not in self.hooks:
            raise ValueError("PFedMeLearner: its MoreauEnvelope must be given as envelope and among its hooks")
        losses = [super(PFedMeLearner, self).step(images, masks, precision) for _ in range(self.inner_steps)]
        self.envelope.pull_anchor(self.model, self.eta)
        return sum(losses) / len(losses)


def start_pfedme(start: PersonalStart) -> PersonalTrainer:
    """pFedMe: ``theta_k`` and ``w_k`` start from the received global model each round."""
    settings = start.settings
    if settings.pfedme_k < 1 or settings.pfedme_eta < 0:
        raise ValueError(f"pFedMe needs pfedme-k >= 1 and pfedme-eta >= 0, got {settings.pfedme_k} "
                         f"and {settings.pfedme_eta}")
    envelope = MoreauEnvelope(start.global_model, settings.pfedme_lambda)
    theta = start.model_from(start.global_weights, "global model")
    learner = PFedMeLearner("personal", theta, start.optimizer(theta.parameters()), start.loss_fn,
                            hooks=[envelope], envelope=envelope, inner_steps=settings.pfedme_k,
                            eta=settings.pfedme_eta)
    return PersonalTrainer(learner)
