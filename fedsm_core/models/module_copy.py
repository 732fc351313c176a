"""A deep copy of a ``torch.nn.Module`` that knows a module's layout, for the templates models are copied from.

Every site round and every evaluation loads a few U-Nets into fresh modules (the
global model, a personalized model, the super model's members); each is a copy
of one template per :class:`~fedsm_core.models.spec.ModelSpec`.
``copy.deepcopy`` gets there generically: it reduces and reconstructs each of the
U-Net's 284 modules and walks every attribute through its memo, about 17 000
calls per copy. A module's state has a known shape (its parameters, buffers and
submodules in three dictionaries, hook dictionaries, and plain settings), so
:func:`copy_module` rebuilds that tree directly, several times faster, and
``tests/models/test_module_copy.py`` checks it against ``copy.deepcopy``.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import torch
import torch.nn as nn

# Values a copy may share with its original: nothing can change them in place.
_ATOMS = frozenset((bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device))
_CONTAINERS = frozenset((dict, OrderedDict, set, list))


def copy_module(module: nn.Module, values: bool = True) -> nn.Module:
    """A copy of ``module`` that shares no tensor, dictionary or submodule with it.

    Equal to ``copy.deepcopy(module)`` for modules whose own attributes are
    parameters, buffers, submodules and plain values: parameters and buffers
    are cloned in their memory format (a channels-last weight stays channels-last),
    ``requires_grad`` is kept, and a tensor or submodule reached twice is
    copied once and stays shared in the copy (tied weights stay tied). Any other
    attribute goes through ``copy.deepcopy`` with the same memo.

    Parameters
    ----------
    module : torch.nn.Module
        The module to copy, with no gradients to carry (a template).
    values : bool
        ``False`` leaves the entries of the state dict (parameters and
        persistent buffers) uninitialised, for a caller that overwrites every
        one (:func:`~fedsm_core.models.weights.set_weights` does): allocating
        memory without writing it is most of what a copy saves. Non-persistent
        buffers, which no state dict restores, are copied either way.

    Returns
    -------
    torch.nn.Module
        The copy, of the same class, in the same training mode.
    """
    return _copy_module(module, {}, values)


def _copy_module(module: nn.Module, memo: dict[int, Any], values: bool) -> nn.Module:
    if id(module) in memo:
        return memo[id(module)]
    clone = module.__class__.__new__(module.__class__)
    memo[id(module)] = clone
    state = {}
    for name, value in module.__dict__.items():
        if name == "_parameters":
            state[name] = {key: _copy_tensor(tensor, memo, values) for key, tensor in value.items()}
        elif name == "_buffers":
            kept = module._non_persistent_buffers_set
            state[name] = {key: _copy_tensor(tensor, memo, values or key in kept) for key, tensor in value.items()}
        elif name == "_modules":
            state[name] = {key: None if child is None else _copy_module(child, memo, values)
                           for key, child in value.items()}
        else:
            state[name] = _copy_value(value, memo)
    clone.__dict__.update(state)
    return clone


def _copy_tensor(tensor: torch.Tensor | None, memo: dict[int, Any], value: bool) -> torch.Tensor | None:
    if tensor is None:
        return None
    if id(tensor) not in memo:
        source = tensor.detach()
        data = source.clone(memory_format=torch.preserve_format) if value else torch.empty_like(source)
        if isinstance(tensor, nn.Parameter):
            data = nn.Parameter(data, requires_grad=tensor.requires_grad)
        if tensor.__dict__:  # attributes set on a parameter, as copy.deepcopy carries them
            data.__dict__.update(copy.deepcopy(tensor.__dict__, memo))
        memo[id(tensor)] = data
    return memo[id(tensor)]


def _copy_value(value: Any, memo: dict[int, Any]) -> Any:
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind in _CONTAINERS and not value:
        return kind()  # the empty hook dictionaries and buffer-name set, most of a module's attributes
    if kind is tuple and all(type(item) in _ATOMS for item in value):
        return value
    return copy.deepcopy(value, memo)
