"""Reading the model files a run writes, and loading its single models.

A run writes one of two kinds of ``torch.save`` dictionary, told apart by
their ``format`` entry:

- ``fedsm-super-model/1``: FedSM's ``super_model.pt`` (global model, K
  personalized models and the selector; see :mod:`fedsm_core.run_files.bundle`);
- ``fedsm-global-model/1``: one segmentation model, the ``global_model.pt`` of
  FedAvg, FedProx, SCAFFOLD and HarmoFL, or one of FedBN's
  ``site_models/<site>.pt``.

:func:`read_model_file` loads either with ``weights_only=True`` and checks the
format once, so a caller that accepts both reads the file a single time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from fedsm_core.models.spec import ModelSpec

BUNDLE_FORMAT = "fedsm-super-model/1"
GLOBAL_MODEL_FORMAT = "fedsm-global-model/1"

# What to pass instead, per accepted format: error messages end with these.
WRITTEN_BY = {
    BUNDLE_FORMAT: "the super_model.pt written by a finished FedSM run",
    GLOBAL_MODEL_FORMAT: "the global_model.pt (FedAvg, FedProx, SCAFFOLD, HarmoFL) or a site_models/<site>.pt "
                         "(FedBN) written by a finished run",
}


@dataclasses.dataclass(frozen=True)
class GlobalModelInfo:
    """Everything in a single-model file besides the weights."""

    spec: ModelSpec
    structures: tuple[str, ...]
    image_size: int
    extra: dict[str, Any]


def read_model_file(path: str | Path, formats: Sequence[str], kind: str) -> dict[str, Any]:
    """The dictionary stored in ``path``, checked to have one of ``formats``.

    Parameters
    ----------
    formats : sequence of str
        The accepted ``format`` entries (keys of :data:`WRITTEN_BY`).
    kind : str
        What the caller expects, for messages ("FedSM bundle").

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    IsADirectoryError
        When ``path`` is a folder (the message lists model files inside it).
    ValueError
        When the file is unreadable (corrupt, truncated, not a torch file) or
        holds another format; the message names the file, what was found and
        the files to pass instead.
    """
    path = Path(path)
    advice = "pass " + " or ".join(WRITTEN_BY[name] for name in formats)
    if path.is_dir():
        inside = sorted(p.relative_to(path).as_posix() for p in path.rglob("*.pt"))[:5]
        found = f"; it holds {', '.join(inside)}" if inside else "; it holds no .pt file"
        raise IsADirectoryError(f"{kind} '{path}' is a folder, not a model file{found}; {advice}")
    if not path.is_file():
        raise FileNotFoundError(f"{kind} '{path}' does not exist; {advice}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for damaged files
        # torch's own advice (weights_only=False) would run untrusted pickles: name the problem only.
        raise ValueError(f"'{path}' is not a readable {kind} ({type(error).__name__}); {advice}") from None
    found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
    if found not in formats:
        expected = " or ".join(repr(name) for name in formats)
        raise ValueError(f"'{path}' is not a {kind}: format {found!r}, expected {expected}; {advice}")
    return payload


def load_global_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, GlobalModelInfo]:
    """Load a file written by :func:`fedsm_core.run_files.bundle.save_global_model`, in eval mode.

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`read_model_file`; a ``ValueError`` also when the weights do
        not fit the stored spec.
    """
    payload = read_model_file(path, (GLOBAL_MODEL_FORMAT,), "FedSM global model")
    return global_model_from_payload(payload, Path(path), device)


def global_model_from_payload(payload: dict[str, Any], path: Path,
                              device: torch.device | str = "cpu") -> tuple[nn.Module, GlobalModelInfo]:
    """The model and info of a payload :func:`read_model_file` accepted as a global model.

    HarmoFL's amplitude normalization needs nothing extra: the spec rebuilds
    the input layer and its frozen amplitude is one of the weights.
    """
    info = GlobalModelInfo(
        spec=ModelSpec(**payload["spec"]),
        structures=tuple(payload["structures"]),
        image_size=int(payload["image_size"]),
        extra=dict(payload["extra"]),
    )
    model = info.spec.load_segmentation({key: value.numpy() for key, value in payload["weights"].items()},
                                        f"{path}: global model")
    return model.to(device).eval(), info
