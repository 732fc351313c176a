"""Choice of the compute device and of CPU threads."""

from __future__ import annotations

import torch


def select_device(name: str = "auto") -> torch.device:
    """``"auto"`` picks CUDA when present, else the CPU; ``"cuda"`` requires a GPU.

    Raises
    ------
    ValueError
        ``device = "cuda"`` on a machine without a CUDA GPU, or an unknown name.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device = 'cuda' but no CUDA GPU is visible; set device = 'auto' or 'cpu'")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"device = '{name}' is not one of ['auto', 'cpu', 'cuda']")
    return torch.device(name)


def set_cpu_threads(threads: int) -> None:
    """Limit torch's intra-op threads; 0 keeps torch's default.

    Several simulated clients share few cores: one thread each avoids
    oversubscription, which measured faster on 2 cores.
    """
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)

