"""Choice of the compute device, its backend switches, host-to-device copies and CPU threads."""

from __future__ import annotations

import os
import re

import torch

DEVICE_NAMES = ("auto", "cpu", "cuda")  # and "cuda:N", a GPU of the machine by index
NO_GPU_HINT = (
    "In a simulation, Ray hides the GPUs from every client that requests none: give each client a GPU share "
    "with CLIENT_GPUS=auto (or a fraction such as 0.25) for scripts/run-simulation.sh, or "
    "--federation-config \"client-resources-num-gpus=0.25\" for flwr run. In deployment, start the SuperNode "
    "on a machine whose GPU torch can see. Otherwise set device = 'auto' or 'cpu'."
)


def select_device(name: str = "auto") -> torch.device:
    """``"auto"`` picks CUDA when present, else the CPU; ``"cuda"`` / ``"cuda:N"`` require that GPU.

    Raises
    ------
    ValueError
        A CUDA device on a process that sees no (or not that) GPU, with what
        to set so it does; or an unknown name.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match is None:
        raise ValueError(f"device = '{name}' is not one of {list(DEVICE_NAMES)} or 'cuda:N' (N a GPU index)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    if not torch.cuda.is_available():
        raise ValueError(f"device = '{name}' but this process sees no CUDA GPU{seen}. {NO_GPU_HINT}")
    index = int(match.group(1) or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"device = '{name}' but this process sees {count} GPU(s) (cuda:0..cuda:{count - 1}){seen}; "
                         "pick one of them, or set device = 'cuda' or 'auto'")
    return torch.device("cuda", index) if match.group(1) is not None else torch.device("cuda")


def configure_backends(device: torch.device, deterministic: bool, precision: str) -> None:
    """Process-wide CUDA switches for training on ``device``; nothing on the CPU.

    ``deterministic = False`` lets cuDNN time its convolution algorithms on the
    first batch of each shape and keep the fastest (``cudnn.benchmark``);
    ``True`` uses deterministic algorithms, so reruns give the same bits.
    TF32 tensor-core math is off under ``precision = 'fp32'`` (float32 then
    means float32, matching the CPU) and allowed otherwise.
    """
    if device.type != "cuda":
        return
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    allow_tf32(precision != "fp32")
    if device.index is not None:  # a pinned GPU (cuda:1) becomes the default of autocast, pinning and new tensors
        torch.cuda.set_device(device)


def tf32_switches() -> list[tuple[object, str]]:
    """The ``(module, attribute)`` flags that allow TF32 math in matmuls and cuDNN on this torch.

    torch 2.9 and later set it per backend with ``fp32_precision`` (``"tf32"``
    or ``"ieee"``) and deprecate ``allow_tf32``; reading ``allow_tf32`` after
    the new flags were set raises, so only one of the two APIs may be used.
    Older torch has ``allow_tf32`` alone.
    """
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision") and hasattr(cudnn, "conv"):
        return [(matmul, "fp32_precision"), (cudnn.conv, "fp32_precision"), (cudnn.rnn, "fp32_precision")]
    return [(matmul, "allow_tf32"), (cudnn, "allow_tf32")]


def allow_tf32(allowed: bool) -> None:
    """Allow (or forbid) TF32 tensor-core math for float32 matmuls and convolutions, with this torch's API."""
    for module, name in tf32_switches():
        setattr(module, name, ("tf32" if allowed else "ieee") if name == "fp32_precision" else allowed)


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``; a CPU tensor bound for CUDA goes through pinned memory without blocking.

    The copy from page-locked memory runs asynchronously, so the CPU prepares
    the next batch while the GPU still computes on this one.
    """
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def describe_device(device: torch.device, precision: str) -> str:
    """One line naming the device (and GPU model), for the log of each site."""
    if device.type != "cuda":
        return f"cpu ({torch.get_num_threads()} torch threads), precision {precision}"
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    return (f"cuda:{index} ({torch.cuda.get_device_name(index)}, CUDA_VISIBLE_DEVICES={visible}), "
            f"precision {precision}")


def set_cpu_threads(threads: int) -> None:
    """Limit torch's intra-op threads; 0 keeps torch's default.

    Several simulated clients share few cores: one thread each avoids
    oversubscription, which measured faster on 2 cores.
    """
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
