"""Tiny float64 linear models and the PersonalStart that wraps them, for hand-checked updates."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from fedsm_core.algorithms.personalization.base import PersonalStart
from fedsm_core.algorithms.personalization.settings import PersonalizationSettings
from fedsm_core.models.weights import get_weights


def linear(weight: list[float], bias: float) -> nn.Linear:
    """``f(x) = weight . x + bias`` in float64."""
    layer = nn.Linear(2, 1).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([weight], dtype=torch.float64))
        layer.bias.copy_(torch.tensor([bias], dtype=torch.float64))
    return layer


def make_start(global_model: nn.Module, personal_model: nn.Module | None = None, lr: float = 0.1,
               client_state=None, **settings) -> PersonalStart:
    """A round's start with SGD at ``lr`` and the mean squared error; ``settings`` override the defaults."""
    personal = personal_model if personal_model is not None else global_model
    return PersonalStart(
        global_model=global_model,
        global_weights=get_weights(global_model),
        personal_weights=get_weights(personal),
        client_state=client_state or {},
        build=lambda: nn.Linear(2, 1).double(),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=lr),
        loss_fn=nn.functional.mse_loss,
        settings=dataclasses.replace(PersonalizationSettings(), **settings),
    )
