"""HarmoFL's weight perturbation (Jiang et al., AAAI 2022), a hook of the local loop.

To reach flat optima that averaging across sites harms less, each step takes
the gradient at a perturbed point:

    g = grad L(w),   delta = alpha * g / ||g||_2,   g' = grad L(w + delta)

then restores ``w`` and lets the optimizer step with ``g'``. ``||g||_2`` is
the norm over all parameters together. ``alpha = 0`` is a plain step (the
second gradient is then taken at ``w`` itself, so it is skipped).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from fedsm_core.models.amplitude import frozen_statistics
from fedsm_core.training.local_update import TrainingHook


class WeightPerturbation(TrainingHook):
    """Replace the gradient at ``w`` by the gradient at ``w + alpha * g / ||g||``.

    Parameters
    ----------
    alpha : float
        Perturbation radius (the paper's default is 0.05); 0 disables it.
    """

    def __init__(self, alpha: float = 0.05) -> None:
        if alpha < 0:
            raise ValueError(f"weight-perturbation alpha = {alpha} must be >= 0")
        self.alpha = float(alpha)

    def regrade(self, model: nn.Module, closure: Callable[[], torch.Tensor]) -> None:
        """Recompute the gradients at the perturbed weights, then restore the weights."""
        if self.alpha == 0.0:
            return
        params = [p for p in model.parameters() if p.grad is not None]
        if not params:
            return
        norm = torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in params))
        if not 0.0 < float(norm) < float("inf"):  # also an overflowed float16 step: the scaler skips it
            return
        with torch.no_grad():
            deltas = [self.alpha * p.grad / norm for p in params]
            for p, d in zip(params, deltas, strict=True):
                p.add_(d)
        with frozen_statistics(model):  # the batch was already counted by the first pass
            closure()
        with torch.no_grad():
            for p, d in zip(params, deltas, strict=True):
                p.sub_(d)
