"""SCAFFOLD (Karimireddy et al., ICML 2020): control variates against client drift."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn

from fedsm_core.algorithms.robust_aggregation import AggregationSettings, robust_average
from fedsm_core.models.weights import Weights
from fedsm_core.training.local_update import TrainingHook


def zero_controls(model: nn.Module) -> Weights:
    """Zero control variates, one per trainable parameter (the state before round 1)."""
    return {name: np.zeros(tuple(p.shape), dtype=np.float32) for name, p in model.named_parameters()}


class ScaffoldCorrection(TrainingHook):
    """Corrects each local gradient by ``c - c_k`` and records the raw gradients.

    Local step: ``y <- y - lr * (g_k(y) - c_k + c)`` (with the run's optimizer in
    place of plain SGD). After the epoch the client's new control variate is
    the mean raw gradient over its local steps,

        c_k+ = (1 / S) * sum_s g_k(y_s),

    which is option II of the paper: with plain SGD,
    ``c_k - c + (x - y) / (S * lr)`` equals exactly that mean.

    Parameters
    ----------
    server_control, client_control : dict
        ``c`` and ``c_k``, one array per trainable parameter.
    """

    def __init__(self, server_control: Mapping[str, np.ndarray], client_control: Mapping[str, np.ndarray]) -> None:
        missing = sorted(set(server_control) ^ set(client_control))
        if missing:
            raise ValueError(f"server and client control variates differ in {missing[:5]}")
        self.correction = {
            name: torch.from_numpy(np.asarray(server_control[name], np.float32)
                                   - np.asarray(client_control[name], np.float32))
            for name in server_control
        }
        self.gradient_sums: dict[str, torch.Tensor] = {}
        self.steps = 0

    def after_backward(self, model: nn.Module) -> None:
        """Record the raw gradient, then add ``c - c_k`` to it."""
        for name, parameter in model.named_parameters():
            if parameter.grad is None:
                continue
            correction = self.correction[name].to(parameter.grad.device)
            self.gradient_sums[name] = self.gradient_sums.get(name, 0) + parameter.grad.detach().clone()
            parameter.grad.add_(correction)
        self.steps += 1

    def new_client_control(self, model: nn.Module) -> Weights:
        """``c_k+``: the mean raw gradient over the local steps (zeros if none were taken)."""
        controls = zero_controls(model)
        for name, total in self.gradient_sums.items():
            controls[name] = (total / max(self.steps, 1)).cpu().numpy().astype(np.float32)
        return controls


def update_server_control(
    server_control: Mapping[str, np.ndarray],
    deltas: Sequence[Mapping[str, np.ndarray]],
    num_clients: int,
    aggregation: AggregationSettings | None = None,
) -> Weights:
    """``c <- c + (1 / N) * sum_{k in S} (c_k+ - c_k)`` over the clients that replied.

    Under a robust ``aggregation`` the sum is ``|S|`` times the robust
    statistic of the deltas, ``c <- c + (|S| / N) R_k (c_k+ - c_k)``, so one
    site's delta cannot drag ``c``.

    Parameters
    ----------
    deltas : sequence of dict
        ``c_k+ - c_k`` of every client that replied this round.
    num_clients : int
        ``N``, all clients of the federation.
    aggregation : AggregationSettings, optional
        The run's aggregation; the plain sum when omitted or ``mean``.
    """
    if aggregation is not None and aggregation.name != "mean":
        robust = robust_average(deltas, [1.0] * len(deltas), aggregation)
        return {name: (np.asarray(value, dtype=np.float64)
                       + len(deltas) / num_clients * np.asarray(robust[name], dtype=np.float64)).astype(np.float32)
                for name, value in server_control.items()}
    updated = {name: np.array(value, dtype=np.float64) for name, value in server_control.items()}
    for delta in deltas:
        for name in updated:
            updated[name] += np.asarray(delta[name], dtype=np.float64) / num_clients
    return {name: value.astype(np.float32) for name, value in updated.items()}
