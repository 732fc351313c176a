"""The super-model bundle: one file that runs FedSM inference in plain PyTorch.

A bundle is a ``torch.save`` dictionary of tensors and plain values (loadable
with ``weights_only=True``): the model spec, site and structure names, gamma,
image size, the run's ``route-by``, and the state dicts of the global model,
the K personalized models and the selector.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsm_core.algorithms.fedsm.settings import ROUTE_BY
from fedsm_core.algorithms.fedsm.super_model import Gamma, SuperModel, assemble_super_model, check_gamma
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import Weights
from fedsm_core.run_files.model_files import BUNDLE_FORMAT, GLOBAL_MODEL_FORMAT, read_model_file

SELECTOR_INCLUDES_GLOBAL = "selector-includes-global"  # key in BundleInfo.extra (FedSM-extra)
# Bundles saved before the payload recorded route-by were routed per image, as the paper routes.
ROUTE_BY_BEFORE_RECORDED = "image"


@dataclasses.dataclass(frozen=True)
class BundleInfo:
    """Everything in a bundle besides the weights.

    ``route_by`` is the run's ``route-by`` (:data:`fedsm_core.algorithms.fedsm.settings.ROUTE_BY`):
    ``"image"`` routes every image alone, ``"case"`` once per case (``fedsm predict``
    takes it as its default for NIfTI volumes, one case each).
    """

    spec: ModelSpec
    site_names: tuple[str, ...]
    structures: tuple[str, ...]
    gamma: Gamma
    image_size: int
    extra: dict[str, Any]
    route_by: str = "image"

    def __post_init__(self) -> None:
        check_route_by(self.route_by, "BundleInfo", "pass one of them (the run's route-by)")


def check_route_by(value: object, where: str, fix: str) -> str:
    """``value`` when it is one of :data:`ROUTE_BY`, else a ``ValueError`` naming ``where``, the value and ``fix``."""
    if value not in ROUTE_BY:
        raise ValueError(f"{where}: route-by = {value!r} is not one of {list(ROUTE_BY)}; {fix}")
    return str(value)


def _tensors(weights: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {key: torch.from_numpy(np.array(value, copy=True)) for key, value in weights.items()}


def write_atomically(path: str | Path, payload: dict[str, Any]) -> Path:
    """``torch.save`` to a temporary file beside ``path``, then rename it over ``path``.

    A crash or a full disk leaves the previous file intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        torch.save(payload, temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return path


def save_bundle(
    path: str | Path,
    info: BundleInfo,
    global_weights: Weights,
    personalized: Sequence[Weights],
    selector_weights: Weights,
) -> Path:
    """Write the bundle atomically (temporary file, then rename) and return its path."""
    if len(personalized) != len(info.site_names):
        raise ValueError(f"{len(personalized)} personalized models for {len(info.site_names)} sites")
    payload = {
        "format": BUNDLE_FORMAT,
        "spec": info.spec.to_dict(),
        "site_names": list(info.site_names),
        "structures": list(info.structures),
        "gamma": list(info.gamma) if isinstance(info.gamma, tuple) else float(info.gamma),
        "image_size": int(info.image_size),
        "extra": dict(info.extra),
        "route_by": info.route_by,
        "global": _tensors(global_weights),
        "personalized": [_tensors(weights) for weights in personalized],
        "selector": _tensors(selector_weights),
    }
    return write_atomically(path, payload)


def load_bundle(path: str | Path, device: torch.device | str = "cpu") -> tuple[SuperModel, BundleInfo]:
    """Load a bundle written by :func:`save_bundle` into a ready :class:`SuperModel`.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        When the file is not a readable FedSM bundle (corrupt, truncated, or
        another kind of file).
    """
    payload = read_model_file(path, (BUNDLE_FORMAT,), "FedSM bundle")
    return bundle_from_payload(payload, Path(path), device)


def bundle_from_payload(payload: dict[str, Any], path: Path,
                        device: torch.device | str = "cpu") -> tuple[SuperModel, BundleInfo]:
    """The super model and info of a payload :func:`read_model_file` accepted as a bundle.

    A payload without ``route_by`` (saved before bundles recorded it) routes per image.
    """
    route_by = payload.get("route_by", ROUTE_BY_BEFORE_RECORDED)
    info = BundleInfo(
        spec=ModelSpec(**payload["spec"]),
        site_names=tuple(payload["site_names"]),
        structures=tuple(payload["structures"]),
        gamma=check_gamma(payload["gamma"]),
        image_size=int(payload["image_size"]),
        extra=dict(payload["extra"]),
        route_by=check_route_by(route_by, f"bundle '{path}'", "the file is damaged or was not written by "
                                "FedSM's server: pass the super_model.pt written by a finished FedSM run"),
    )
    return _assemble(info, payload, path).to(device), info


def _assemble(info: BundleInfo, payload: dict[str, Any], path: Path) -> SuperModel:
    def numpy(state: Mapping[str, torch.Tensor]) -> Weights:
        return {key: value.numpy() for key, value in state.items()}

    return assemble_super_model(info.spec, numpy(payload["global"]), [numpy(s) for s in payload["personalized"]],
                                numpy(payload["selector"]), info.gamma,
                                bool(info.extra.get(SELECTOR_INCLUDES_GLOBAL, False)), info.site_names, f"{path}: ")


def save_global_model(path: str | Path, spec: ModelSpec, structures: Sequence[str], image_size: int,
                      weights: Weights, extra: Mapping[str, Any] | None = None) -> Path:
    """Write a single model (FedAvg, FedProx, SCAFFOLD, HarmoFL, a FedBN site, centralized) atomically.

    :func:`fedsm_core.run_files.model_files.load_global_model` reads it back.
    """
    payload = {
        "format": GLOBAL_MODEL_FORMAT,
        "spec": spec.to_dict(),
        "structures": list(structures),
        "image_size": int(image_size),
        "extra": dict(extra or {}),
        "weights": _tensors(weights),
    }
    return write_atomically(path, payload)
