"""Numeric precision of local training: float32, or bfloat16 / float16 autocast.

``precision`` (a run-config key) is one of :data:`PRECISIONS`:

``fp32``
    Plain float32. On CUDA, TF32 tensor-core math is switched off too
    (:func:`fedsm_core.device.configure_backends`), so a GPU round matches a
    CPU round up to summation order.
``bf16``
    Forward passes under ``torch.autocast(dtype=torch.bfloat16)``. bfloat16 has
    float32's exponent range, so gradients need no scaling.
``fp16``
    Forward passes under float16 autocast, with a gradient scaler: the loss is
    multiplied by a scale before ``backward`` so small gradients do not flush
    to zero, gradients are unscaled before any hook reads them, and a step
    whose gradients hold ``inf``/``nan`` is skipped (the scale then shrinks).
``auto``
    ``bf16`` on a CUDA device that supports it, otherwise ``fp32`` (on the CPU,
    bfloat16 kernels are rarely faster).

Autocast only changes the dtype of activations: parameters, optimizer state
and therefore the weights a site sends stay float32 whatever the precision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from fedsm_core.checks import check_choice

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(name: str, device: torch.device | str) -> str:
    """The concrete precision (``fp32``, ``bf16`` or ``fp16``) of ``name`` on ``device``.

    Raises
    ------
    ValueError
        An unknown name, or ``bf16`` on a CUDA GPU without bfloat16 support.
    """
    device = torch.device(device)
    check_choice("precision", name, PRECISIONS)
    on_cuda = device.type == "cuda"
    if name == "auto":
        return "bf16" if on_cuda and torch.cuda.is_bf16_supported() else "fp32"
    if name == "bf16" and on_cuda and not torch.cuda.is_bf16_supported():
        raise ValueError(f"precision = 'bf16' but {torch.cuda.get_device_name(device)} does not support "
                         "bfloat16; set precision = 'fp16' (with gradient scaling) or 'auto'")
    return name


class StepPrecision:
    """How one learner computes its loss and applies its gradients.

    The default is plain float32: no autocast, ``loss.backward()`` and
    ``optimizer.step()``. With ``dtype`` the forward pass runs under autocast;
    with ``scaler`` (a :class:`torch.amp.GradScaler`, or any object with its
    ``scale`` / ``unscale_`` / ``step`` / ``update`` / ``get_scale`` methods)
    the loss is scaled before ``backward`` and the step goes through the
    scaler. Each learner needs its own scaler: the scale follows one
    optimizer's overflows.

    Parameters
    ----------
    device_type : str
        ``"cpu"`` or ``"cuda"``, the device the model runs on.
    dtype : torch.dtype, optional
        Autocast dtype; ``None`` runs in float32.
    scaler : GradScaler-like, optional
        Gradient scaler (float16 training).
    """

    def __init__(self, device_type: str = "cpu", dtype: torch.dtype | None = None, scaler: Any = None) -> None:
        self.device_type, self.dtype, self.scaler = device_type, dtype, scaler

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Context of a forward pass: autocast to ``dtype``, or nothing."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """``backward`` of the (scaled) loss."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def unscale(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Bring every gradient of ``model`` back to its true size before hooks read it.

        The scaler unscales the optimizer's parameters (and notes any
        ``inf``/``nan``); gradients of parameters the optimizer does not own
        (APFL's mixing weight ``alpha``) are divided by the scale here.
        """
        if self.scaler is None:
            return
        self.scaler.unscale_(optimizer)
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        others = [p for p in model.parameters() if p.grad is not None and id(p) not in owned]
        if others:
            inverse = 1.0 / float(self.scaler.get_scale())
            with torch.no_grad():
                for parameter in others:
                    parameter.grad.mul_(inverse)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``; with a scaler, skipped on overflow, then the scale is updated."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()


FP32 = StepPrecision()


def step_precision(name: str, device: torch.device | str) -> StepPrecision:
    """A fresh :class:`StepPrecision` for one learner (its own scaler for ``fp16``).

    ``name`` is resolved with :func:`resolve_precision` first.
    """
    device = torch.device(device)
    resolved = resolve_precision(name, device)
    if resolved == "fp32":
        return FP32
    scaler = torch.amp.GradScaler(device.type) if resolved == "fp16" else None
    return StepPrecision(device.type, AUTOCAST_DTYPES[resolved], scaler)
