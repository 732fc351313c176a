"""Adam for the models a site trains, and its moments as named arrays to keep or average with the weights."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import torch.nn as nn

# A site's Adam state for each model it trains (optimizer-state): fresh every round, kept at the site, or
# averaged by the server with the weights it belongs to.
OPTIMIZER_STATES = ("reset", "local", "averaged")

MOMENT_KEYS = ("exp_avg", "exp_avg_sq")

# Devices whose parameters torch's fused Adam kernel steps (torch >= 2.4 has it for both).
FUSED_DEVICES = ("cpu", "cuda")


def new_adam(parameters: Iterable[torch.Tensor], lr: float) -> torch.optim.Adam:
    """A fresh Adam (Kingma & Ba) for one model, with torch's fused kernel where the parameters allow it.

    ``m_t = b1 m_{t-1} + (1 - b1) g_t``, ``v_t = b2 v_{t-1} + (1 - b2) g_t^2``,
    ``w_t = w_{t-1} - lr (m_t / (1 - b1^t)) / (sqrt(v_t / (1 - b2^t)) + eps)``, with torch's
    defaults ``b1, b2 = 0.9, 0.999`` and ``eps = 1e-8``.

    The fused kernel runs this update in one pass over every parameter, where torch's default on the
    CPU loops over the parameters with about a dozen tensor operations each: on the U-Net (4.1 M
    parameters, 188 tensors, one CPU thread) a step takes about 11 ms against 46 ms, about a tenth of a
    training step at 64 px (``experiments/results/bench-fused-adam/``). The update rule is the same; the
    weights differ from the loop's by floating-point order only (``tests/training/test_optimizer_state.py``).
    Parameters on other devices, or not floating point, get torch's default implementation.
    """
    parameters = list(parameters)
    fused = all(p.device.type in FUSED_DEVICES and p.dtype.is_floating_point for p in parameters)
    return torch.optim.Adam(parameters, lr=lr, fused=True if fused else None)


def adam_state_to_arrays(model: nn.Module, optimizer: torch.optim.Adam) -> dict[str, np.ndarray]:
    """Export Adam's first and second moments and step count, keyed by parameter name.

    Keys are ``"<parameter>/exp_avg"``, ``"<parameter>/exp_avg_sq"`` and
    ``"<parameter>/step"``. A parameter that has not been stepped yet is exported
    with zero moments and step 0, so every export has the same layout.
    """
    arrays: dict[str, np.ndarray] = {}
    for name, parameter in model.named_parameters():
        state = optimizer.state.get(parameter, {})
        for key in MOMENT_KEYS:
            value = state.get(key)
            arrays[f"{name}/{key}"] = (
                value.detach().cpu().numpy().copy()
                if value is not None
                else np.zeros(tuple(parameter.shape), _numpy_dtype(parameter))
            )
        step = state.get("step", 0.0)
        arrays[f"{name}/step"] = np.asarray(float(step), dtype=np.float32)
    return arrays


def fresh_adam_state(model: nn.Module) -> dict[str, np.ndarray]:
    """The layout of :func:`adam_state_to_arrays` for a fresh Adam: zero moments, step 0.

    Loading it leaves an Adam fresh; it is what the server averages into under
    ``optimizer-state = averaged`` before the sites' first replies.
    """
    return adam_state_to_arrays(model, torch.optim.Adam(model.parameters()))


def load_adam_state(model: nn.Module, optimizer: torch.optim.Adam, arrays: dict[str, np.ndarray]) -> None:
    """Load moments exported by :func:`adam_state_to_arrays` into ``optimizer``.

    An empty ``arrays`` leaves the optimizer fresh (the first round). Parameters
    with step 0 are left without state, as a fresh Adam would have them.
    """
    if not arrays:
        return
    for name, parameter in model.named_parameters():
        keys = [f"{name}/{key}" for key in (*MOMENT_KEYS, "step")]
        missing = [key for key in keys if key not in arrays]
        if missing:
            raise ValueError(f"optimizer state lacks {missing}; it does not belong to this model")
        step = float(np.asarray(arrays[keys[2]]))
        if step <= 0:
            optimizer.state.pop(parameter, None)
            continue
        # torch keeps the step count on the parameter's device for its fused kernel, on the CPU otherwise
        on = parameter.device if optimizer.defaults.get("fused") else None
        optimizer.state[parameter] = {
            "step": torch.tensor(step, dtype=torch.float32, device=on),
            "exp_avg": _moment_like(parameter, arrays[keys[0]]),
            "exp_avg_sq": _moment_like(parameter, arrays[keys[1]]),
        }


def _moment_like(parameter: torch.Tensor, values: np.ndarray) -> torch.Tensor:
    """``values`` on the parameter's device, in its dtype and memory layout.

    The fused kernel walks a parameter, its gradient and its moments element by element in memory: a
    moment laid out otherwise than its channels-last parameter would be paired with the wrong weights.
    """
    return torch.empty_like(parameter, memory_format=torch.preserve_format).copy_(torch.from_numpy(np.asarray(values)))


def _numpy_dtype(parameter: torch.Tensor) -> np.dtype:
    return torch.empty(0, dtype=parameter.dtype).numpy().dtype


def learners_state_to_arrays(learners) -> dict[str, np.ndarray]:
    """:func:`adam_state_to_arrays` of several learners, each key prefixed ``"<learner name>:"``.

    FedSM trains a global copy and a personalized model at a site; under
    ``optimizer-state = local`` the site keeps both Adams in one record.
    """
    return {f"{learner.name}:{key}": value for learner in learners
            for key, value in adam_state_to_arrays(learner.model, learner.optimizer).items()}


def load_learners_state(learners, arrays: dict[str, np.ndarray]) -> None:
    """Load :func:`learners_state_to_arrays`'s output back; an empty ``arrays`` leaves every Adam fresh."""
    for learner in learners:
        prefix = f"{learner.name}:"
        load_adam_state(learner.model, learner.optimizer,
                        {key[len(prefix):]: value for key, value in arrays.items() if key.startswith(prefix)})
