"""Weight dictionaries in and out of modules: set_weights loads what load_state_dict would, from any numpy array."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedsm_core.models.weights import get_weights, set_weights


class _Small(nn.Module):
    """A conv, a batch norm (with its integer counter) and a float64 buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.norm = nn.BatchNorm2d(3)
        self.register_buffer("scale", torch.zeros(2, 4, dtype=torch.float64))


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: (rng.normal(size=value.shape) * 10).astype(value.dtype)
            for name, value in get_weights(_Small()).items()}


def test_set_weights_loads_what_load_state_dict_loads_from_read_only_strided_and_wider_arrays():
    # Prepare: float64 values for float32 parameters, a read-only array, a transposed (strided) one
    weights = _weights(1)
    wide = {name: value.astype(np.float64) if value.dtype == np.float32 else value for name, value in weights.items()}
    wide["conv.bias"].setflags(write=False)
    wide["scale"] = np.ascontiguousarray(weights["scale"].T).T  # same values, Fortran order
    expected = _Small()
    expected.load_state_dict({name: torch.from_numpy(np.array(value)).to(tensor.dtype)
                              for (name, value), tensor in zip(wide.items(), expected.state_dict().values(),
                                                               strict=True)})

    # Execute
    model = _Small()
    set_weights(model, wide)

    # Assert: bit for bit, every parameter and buffer (the 0-d counter too), dtypes kept
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == expected.state_dict()[name].dtype, name
        assert torch.equal(tensor, expected.state_dict()[name]), name
    assert model.norm.num_batches_tracked.shape == ()


def test_set_weights_refuses_a_missing_key_or_a_wrong_shape_naming_the_source():
    weights = _weights(2)
    with pytest.raises(ValueError, match=r"reply of site-3: keys differ .*missing \['conv.bias'\]"):
        set_weights(_Small(), {k: v for k, v in weights.items() if k != "conv.bias"}, "reply of site-3")
    weights["norm.weight"] = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"'norm.weight' has shape \(4,\), expected \(3,\)"):
        set_weights(_Small(), weights, "x")
