"""FedProx's proximal term (Li et al., MLSys 2020) as a hook of the local-training loop."""

from __future__ import annotations

import torch
import torch.nn as nn

from fedsm_core.training.local_update import TrainingHook


class ProximalTerm(TrainingHook):
    """Adds ``mu / 2 * ||w - w_global||^2`` to the local loss.

    The gradient of the term is ``mu * (w - w_global)``: it pulls the local model
    back toward the global model it started from. ``mu = 0`` is FedAvg.

    Parameters
    ----------
    model : nn.Module
        The local copy of the global model, *before* local training; its
        parameters at construction are ``w_global``.
    mu : float
        Proximal coefficient, ``mu >= 0``.
    """

    def __init__(self, model: nn.Module, mu: float) -> None:
        if mu < 0:
            raise ValueError(f"proximal-mu = {mu} must be >= 0; set it in [tool.flwr.app.config]")
        self.mu = float(mu)
        self.anchor = {name: p.detach().clone() for name, p in model.named_parameters()}

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        """``mu / 2 * sum ||w - w_global||^2`` over trainable parameters; ``None`` when ``mu = 0``."""
        if self.mu == 0.0:
            return None
        squared = [((p - self.anchor[name]) ** 2).sum() for name, p in model.named_parameters() if p.requires_grad]
        return 0.5 * self.mu * torch.stack(squared).sum()
