"""copy_module against copy.deepcopy: the same module, made without the generic reduce and reconstruct."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn as nn

from fedsm_core.models.module_copy import copy_module
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights, set_weights


class _Tied(nn.Module):
    """A module with a tied weight, a non-persistent buffer, a frozen parameter and a plain list attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        self.second = nn.Linear(3, 3)
        self.second.weight = self.first.weight
        self.scale = nn.Parameter(torch.tensor([2.0]), requires_grad=False)
        self.register_buffer("offset", torch.tensor([0.5]), persistent=False)
        self.register_buffer("count", torch.tensor(3))
        self.names = ["a", "b"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)) * self.scale + self.offset


def _u_net() -> nn.Module:
    torch.manual_seed(0)
    return ModelSpec("mobilenet_v2", 2, 3, input_norm="per-image").build_segmentation()


def test_a_copied_u_net_is_the_deep_copy_in_values_layout_and_output():
    # Prepare: a channels-last U-Net in evaluation mode
    model = _u_net().eval()

    # Execute
    ours, theirs = copy_module(model), copy.deepcopy(model)

    # Assert: the same modules, values, strides and modes as torch's deep copy, and the same output bit for bit
    assert str(ours) == str(theirs) and type(ours) is type(model) and not ours.training
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items(), strict=True):
        assert torch.equal(a, b) and a.stride() == b.stride() and a.dtype == b.dtype, name
    image = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(ours(image), theirs(image))


def test_a_copy_shares_no_tensor_dictionary_or_hook_with_its_original():
    # Prepare
    model = _Tied()

    # Execute: change the copy in every way a caller can
    clone = copy_module(model)
    with torch.no_grad():
        clone.first.weight.add_(1.0)
        clone.offset.add_(1.0)
    clone.register_forward_hook(lambda *args: None)
    clone.names.append("c")
    clone.first.bias = None

    # Assert: the original is untouched
    assert not model._forward_hooks and model.names == ["a", "b"] and model.first.bias is not None
    assert not torch.equal(clone.first.weight, model.first.weight) and float(model.offset) == 0.5


def test_tied_weights_stay_tied_and_flags_are_kept():
    # Execute
    clone, theirs = copy_module(_Tied()), copy.deepcopy(_Tied())

    # Assert: as in torch's deep copy
    assert (clone.first.weight is clone.second.weight) == (theirs.first.weight is theirs.second.weight) is True
    assert isinstance(clone.scale, nn.Parameter) and clone.scale.requires_grad is False
    assert clone._non_persistent_buffers_set == {"offset"} and clone.count.dtype == torch.long


def test_a_copy_without_values_takes_any_weights_and_keeps_what_no_state_dict_restores():
    # Prepare: weights other than the template's
    model, other = _u_net(), ModelSpec("mobilenet_v2", 2, 3, input_norm="per-image").build_segmentation()
    weights = get_weights(other)

    # Execute
    blank = copy_module(model, values=False)
    set_weights(blank, weights)
    tied = copy_module(_Tied(), values=False)

    # Assert: after loading, the same model as the one the weights came from; the non-persistent buffer
    # (which set_weights never writes) holds its value, and a tie survives
    for key, value in get_weights(blank).items():
        np.testing.assert_array_equal(value, weights[key], err_msg=key)
        assert blank.state_dict()[key].stride() == other.state_dict()[key].stride(), key
    image = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(blank.eval()(image), other.eval()(image))
    assert float(tied.offset) == 0.5 and tied.first.weight is tied.second.weight
