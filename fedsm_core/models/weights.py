"""Model weights as plain ``name -> numpy array`` dictionaries."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn as nn

Weights = dict[str, np.ndarray]


def check_same_layout(reference: Mapping[str, np.ndarray], other: Mapping[str, np.ndarray], where: str) -> None:
    """Raise ``ValueError`` when ``other`` has different keys or shapes than ``reference``.

    Parameters
    ----------
    reference, other : Mapping[str, np.ndarray]
        Weight dictionaries to compare.
    where : str
        Names the source of ``other`` in the message (e.g. ``"reply of site-3"``).
    """
    missing = sorted(set(reference) - set(other))
    extra = sorted(set(other) - set(reference))
    if missing or extra:
        raise ValueError(f"{where}: keys differ from the model (missing {missing[:5]}, unexpected {extra[:5]})")
    for key, value in reference.items():
        if np.shape(other[key]) != np.shape(value):
            raise ValueError(
                f"{where}: '{key}' has shape {np.shape(other[key])}, expected {np.shape(value)}"
            )


def get_weights(model: nn.Module) -> Weights:
    """Copy the full state (parameters and buffers, e.g. batch-norm statistics)."""
    return {name: tensor.detach().cpu().numpy().copy() for name, tensor in model.state_dict().items()}


def set_weights(model: nn.Module, weights: Mapping[str, np.ndarray], where: str = "weights") -> None:
    """Load ``weights`` into ``model``; a key or shape mismatch raises ``ValueError``.

    Parameters
    ----------
    where : str
        Names the source of the weights in error messages.
    """
    reference = model.state_dict()
    shapes = {name: np.broadcast_to(np.float32(0), tuple(t.shape)) for name, t in reference.items()}
    check_same_layout(shapes, weights, where)
    state = {
        name: torch.from_numpy(np.array(weights[name], copy=True)).to(dtype=tensor.dtype)
        for name, tensor in reference.items()
    }
    model.load_state_dict(state, strict=True)
