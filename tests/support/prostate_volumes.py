"""Small NIfTI prostate volumes with a known gland, and predictors whose output is known, for predict tests."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import torch

from fedsm_core.data.preprocess import resize_mask
from fedsm_core.inference.predict import Predictor

SHAPE = (48, 40, 6)
SPACING = (0.6, 0.7, 3.0)  # mm: anisotropic, thick slices as in prostate T2
# Voxel -> world: 30 degrees about z, the spacing, and an offset: a non-identity affine.
_COS, _SIN = np.cos(np.pi / 6), np.sin(np.pi / 6)
AFFINE = np.array([[_COS * 0.6, -_SIN * 0.7, 0.0, -12.0],
                   [_SIN * 0.6, _COS * 0.7, 0.0, 8.0],
                   [0.0, 0.0, 3.0, 40.5],
                   [0.0, 0.0, 0.0, 1.0]])


def gland(shape: tuple[int, int, int] = SHAPE) -> np.ndarray:
    """``bool [x, y, z]``: an ellipsoid at (24, 19, 2.5) with radii 14, 10, 2.2 voxels.

    Slices 0 and 5 miss it (|z - 2.5| = 2.5 > 2.2); slices 1..4 hold 235, 413, 413, 235 voxels.
    """
    x, y, z = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    return ((x - 24) / 14) ** 2 + ((y - 19) / 10) ** 2 + ((z - 2.5) / 2.2) ** 2 <= 1


def mr_image(truth: np.ndarray, seed: int = 0) -> np.ndarray:
    """``int16`` intensities: gland 600, background 200, noise of +-20."""
    noise = np.random.default_rng(seed).integers(-20, 21, truth.shape)
    return (np.where(truth, 600, 200) + noise).astype(np.int16)


def write_volume(path: Path, data: np.ndarray, affine: np.ndarray = AFFINE) -> Path:
    """Save ``data`` as NIfTI with ``affine`` (both qform and sform, code 1 = scanner)."""
    image = nib.Nifti1Image(data, affine)
    image.set_qform(affine, code=1)
    image.set_sform(affine, code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(image, path)
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes (to show that nothing changed)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class OracleRouter:
    """A router that returns the true mask of each slice, in order, as training targets at ``size``.

    The logits are the truth resized as training resizes masks (nearest, to
    ``size x size``), +10 inside and -10 outside: a model that learnt its
    targets perfectly. ``routes`` names the model of each slice (a super
    model's router reports one per slice), cycling if shorter than the volume.
    """

    def __init__(self, truth: np.ndarray, size: int, routes: tuple[str, ...] = ("global",)) -> None:
        self.truth, self.size, self.routes, self.seen = truth, size, routes, 0

    def __call__(self, inputs: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, str]]]:
        logits, columns = [], []
        for _ in range(len(inputs)):
            z = self.seen
            target = resize_mask(self.truth[None, :, :, z], self.size)
            logits.append(torch.from_numpy(np.where(target, 10.0, -10.0)).float())
            columns.append({"model": self.routes[z % len(self.routes)], "selector-confidence": "0.9000",
                            "most-likely-site": "site-a"})
            self.seen += 1
        return torch.stack(logits), columns


def oracle_predictor(truth: np.ndarray, size: int, routes: tuple[str, ...] = ("global",)) -> Predictor:
    """A percentile-preprocessing predictor of one structure (prostate) that returns ``truth``."""
    return Predictor(OracleRouter(truth, size, routes), size, "percentile", ("prostate",))


def _threshold(inputs: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, str]]]:
    columns = [{"model": "global", "selector-confidence": "", "most-likely-site": ""}] * len(inputs)
    return (inputs[:, :1] - 0.5) * 40, columns


def threshold_predictor(size: int) -> Predictor:
    """A single model of one structure: foreground where the normalised slice exceeds 0.5."""
    return Predictor(_threshold, size, "percentile", ("prostate",))
