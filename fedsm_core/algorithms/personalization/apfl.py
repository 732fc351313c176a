"""APFL (Deng, Kamani & Mahdavi 2020, arXiv 2003.13461) as FedSM's personalized-model trainer.

APFL keeps, besides the local copy ``w`` of the global model, a local model
``v_k`` and a mixing weight ``alpha_k`` at each site. Its personalized model
is their mixture (Algorithm 1 of the paper)::

    v_bar_k = alpha_k * v_k + (1 - alpha_k) * w

and one minibatch ``xi`` updates (with ``eta`` the step size)::

    v_k     <- v_k - eta * grad_v f_k(v_bar_k; xi) = v_k - eta * alpha_k * grad f_k(v_bar_k; xi)
    alpha_k <- alpha_k - eta_alpha * <v_k - w, grad f_k(v_bar_k; xi)>        (Eq. 9)

The mixture is taken in parameter space, as in the paper's algorithm, so the
deployed personalized model is one network of the same shape as the global
model, and the super model routes to it like to any other personalized model:
no approximation is made at deployment. (Some implementations mix outputs,
``alpha * v(x) + (1 - alpha) * w(x)``; that would need two networks per site
in the super model.) Buffers (batch-norm statistics) are ``v_k``'s own: they
are the ones the mixture's forward pass uses.

In FedSM the global learner steps ``w`` on the same minibatch just before the
personalized learner, so ``v_bar`` is formed with the ``w`` of that step.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.func import functional_call

from fedsm_core.algorithms.personalization.base import Batches, PersonalStart, PersonalTrainer
from fedsm_core.models.weights import Weights, get_weights
from fedsm_core.training.local_update import Learner, TrainingHook

LOCAL_PREFIX = "apfl-local|"
ALPHA_KEY = "apfl-alpha"


class ParameterMixture(nn.Module):
    """The network with parameters ``alpha * v + (1 - alpha) * w``.

    Gradients flow to ``v`` (the ``local`` submodule) and to ``alpha``; ``w``
    is read, detached, from the global model, whose training stays the global
    learner's.

    Parameters
    ----------
    local : nn.Module
        ``v``.
    global_model : nn.Module
        ``w``, the same architecture.
    alpha : float
        Initial mixing weight in ``[0, 1]``.
    """

    def __init__(self, local: nn.Module, global_model: nn.Module, alpha: float) -> None:
        super().__init__()
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"apfl-alpha = {alpha} is outside [0, 1]")
        self.local = local
        dtype = next(local.parameters()).dtype
        self.alpha = nn.Parameter(torch.tensor(float(alpha), dtype=dtype, device=next(local.parameters()).device))
        # Not a submodule: its parameters must not reach this learner's optimizer or state_dict.
        object.__setattr__(self, "global_model", global_model)

    def mixed_parameters(self) -> dict[str, torch.Tensor]:
        """``alpha * v + (1 - alpha) * w`` for every parameter, differentiable in ``v`` and ``alpha``."""
        reference = dict(self.global_model.named_parameters())
        return {name: self.alpha * v + (1.0 - self.alpha) * reference[name].detach()
                for name, v in self.local.named_parameters()}

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The mixed network's output, ``f(x; v_bar)``, shape as the model's."""
        return functional_call(self.local, self.mixed_parameters(), (inputs,))

    def mixed_weights(self) -> Weights:
        """``v_bar`` as plain weights: mixed parameters, ``v``'s buffers."""
        weights = get_weights(self.local)
        with torch.no_grad():
            for name, value in self.mixed_parameters().items():
                weights[name] = value.detach().cpu().numpy().astype(weights[name].dtype)
        return weights


class AlphaStep(TrainingHook):
    """Eq. 9 of APFL: ``alpha <- clip(alpha - eta_alpha * d f / d alpha, 0, 1)``.

    Autograd's ``d f / d alpha`` through :class:`ParameterMixture` is
    ``<v - w, grad f(v_bar)>``. ``eta_alpha = 0`` keeps ``alpha`` fixed.
    """

    def __init__(self, lr: float) -> None:
        if lr < 0:
            raise ValueError(f"apfl-alpha-lr = {lr} must be >= 0")
        self.lr = float(lr)

    def after_step(self, model: nn.Module) -> None:
        """Step and clip ``alpha``, then clear its gradient (the learner's optimizer does not own it)."""
        alpha = model.alpha
        # A float16 step that overflowed (skipped by the scaler) leaves a non-finite gradient: skip alpha's too.
        if alpha.grad is not None and self.lr > 0 and bool(torch.isfinite(alpha.grad).all()):
            with torch.no_grad():
                alpha.sub_(self.lr * alpha.grad).clamp_(0.0, 1.0)
        alpha.grad = None


class APFLTrainer(PersonalTrainer):
    """Deploys ``v_bar_k``; keeps ``v_k`` and ``alpha_k`` on the site for its next round."""

    def deployed(self, batches: Batches) -> Weights:
        """``v_bar_k = alpha_k v_k + (1 - alpha_k) w`` with ``w`` the local copy after this round."""
        return self.learner.model.mixed_weights()

    def client_state(self) -> Weights:
        """``v_k`` (keys prefixed ``apfl-local|``) and ``alpha_k``."""
        mixture = self.learner.model
        state = {LOCAL_PREFIX + name: value for name, value in get_weights(mixture.local).items()}
        state[ALPHA_KEY] = np.array(float(mixture.alpha.detach()), dtype=np.float64)
        return state


def start_apfl(start: PersonalStart) -> APFLTrainer:
    """APFL's learner: ``v_k`` and ``alpha_k`` from the site's state, or fresh.

    Before a site's first round (or when its node lost its state, e.g. after a
    restart) ``v_k`` starts from the personalized model the server holds and
    ``alpha_k`` from ``apfl-alpha``.
    """
    if ALPHA_KEY in start.client_state:
        local_weights = {name[len(LOCAL_PREFIX):]: value for name, value in start.client_state.items()
                         if name.startswith(LOCAL_PREFIX)}
        local = start.model_from(local_weights, "APFL local model kept by the site")
        alpha = float(np.clip(start.client_state[ALPHA_KEY], 0.0, 1.0))
    else:
        local = start.model_from(start.personal_weights, "personalized model")
        alpha = start.settings.apfl_alpha
    mixture = ParameterMixture(local, start.global_model, alpha)
    hook = AlphaStep(start.settings.apfl_alpha_lr)
    learner = Learner("personal", mixture, start.optimizer(local.parameters()), start.loss_fn, hooks=[hook])
    return APFLTrainer(learner)
