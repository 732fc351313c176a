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
    reference = model.state_dict()  # detached tensors sharing the parameters' and buffers' storage
    shapes = {name: np.broadcast_to(np.float32(0), tuple(t.shape)) for name, t in reference.items()}
    check_same_layout(shapes, weights, where)
    # Copied in place (casting to each tensor's dtype and device): the same values as load_state_dict(strict=True),
    # which no module here customises, about 4x faster, and a site loads several models per round.
    with torch.no_grad():
        for name, tensor in reference.items():
            value = np.asarray(weights[name])
            if not (value.flags.writeable and value.flags.c_contiguous):  # from_numpy needs both
                value = value.copy(order="C")
            tensor.copy_(torch.from_numpy(value))
