"""Adam moments as named arrays, so they can be averaged with the weights they belong to."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

# A site's Adam state for each model it trains (optimizer-state): fresh every round, kept at the site, or
# averaged by the server with the weights it belongs to.
OPTIMIZER_STATES = ("reset", "local", "averaged")

MOMENT_KEYS = ("exp_avg", "exp_avg_sq")


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
        like = {"device": parameter.device, "dtype": parameter.dtype}
        optimizer.state[parameter] = {
            "step": torch.tensor(step, dtype=torch.float32),
            "exp_avg": torch.from_numpy(np.array(arrays[keys[0]])).to(**like),
            "exp_avg_sq": torch.from_numpy(np.array(arrays[keys[1]])).to(**like),
        }


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
