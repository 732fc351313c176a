"""NIfTI volumes for ``fedsm predict``: finding them, reading their geometry, writing label volumes.

A ``--images`` folder holds either 2-D images or NIfTI volumes (``.nii``,
``.nii.gz``), never both (:func:`input_kind`). Volumes are listed by case name
(``Case00.nii.gz`` -> ``Case00``) as the NIfTI loader pairs them
(:mod:`fedsm_core.data.nifti_cases`); label volumes of the ``multisite``
layout (``Case00_segmentation.nii.gz``) are left out, so ``--images`` may be a
site folder. The voxel data is read by the loader's own reader
(:func:`fedsm_core.data.nifti_cases.read_image`); here only the header is read,
first, so that every volume's shape is checked before anything is written.

A 4-D volume (x, y, z, modality) is segmented in one channel, ``--modality``,
which has no default: the model was trained on one of them and guessing could
silently segment the wrong contrast (:func:`check_modality`).

The mask of ``<case>.nii[.gz]`` is ``<case>_segmentation.nii.gz``
(:func:`mask_volume_name`, the label name of the ``multisite`` layout), written
by :func:`write_label_volume` on the input's voxel grid: same affine, same
header (so the same spacing and orientation codes), ``uint8`` labels.
"""

from __future__ import annotations

import dataclasses
import warnings
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.filebasedimages import ImageFileError
from nibabel.spatialimages import HeaderDataError

from fedsm_core.data.files import IMAGE_SUFFIXES, DataError
from fedsm_core.data.nifti_cases import LABEL_SUFFIX, NIFTI_SUFFIXES

MASK_VOLUME_SUFFIX = f"{LABEL_SUFFIX}.nii.gz"
# What nibabel raises for a file that is not a readable NIfTI volume.
_READ_ERRORS = (ImageFileError, HeaderDataError, OSError, EOFError, ValueError, zlib.error)


@dataclasses.dataclass(frozen=True)
class VolumeInput:
    """One input volume's file and geometry (its header only; the voxels are read later).

    Attributes
    ----------
    path : Path
        The volume file.
    shape : tuple of int
        Its voxel shape: ``(x, y, z)`` or ``(x, y, z, modality)``.
    affine : ndarray
        ``float64 [4, 4]`` voxel-to-world matrix, given to the mask volume.
    header : nibabel.nifti1.Nifti1Header
        A copy of its header, the start of the mask volume's header.
    """

    path: Path
    shape: tuple[int, ...]
    affine: np.ndarray
    header: nib.nifti1.Nifti1Header


def volume_case(file_name: str) -> str | None:
    """The case name of a NIfTI file name (``Case00.nii.gz`` -> ``Case00``), else None."""
    lower = file_name.lower()
    suffix = next((s for s in NIFTI_SUFFIXES if lower.endswith(s)), None)
    return file_name[: -len(suffix)] if suffix else None


def mask_volume_name(volume: Path) -> str:
    """File name of a volume's mask: ``<case>_segmentation.nii.gz``."""
    return f"{volume_case(Path(volume).name)}{MASK_VOLUME_SUFFIX}"


def _visible_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise DataError(f"--images {folder} is not a folder")
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def input_kind(folder: Path) -> str:
    """``"volumes"`` when ``folder`` holds NIfTI files, else ``"images"``; a folder with both is refused."""
    files = _visible_files(Path(folder))
    volumes = [p.name for p in files if volume_case(p.name) is not None]
    images = [p.name for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    if volumes and images:
        raise DataError(f"--images {folder} mixes {len(images)} 2-D image(s) ({', '.join(images[:3])}) and "
                        f"{len(volumes)} NIfTI volume(s) ({', '.join(volumes[:3])}); predict segments one kind "
                        "per run: put them in two folders and run predict on each")
    return "volumes" if volumes else "images"


def list_input_volumes(folder: Path) -> list[Path]:
    """NIfTI volumes of ``folder`` sorted by name, label volumes left out (with a warning).

    Raises
    ------
    DataError
        When there are none, or two files are one case (``a.nii`` and
        ``a.nii.gz``), whose masks would overwrite each other.
    """
    folder = Path(folder)
    nifti = [p for p in _visible_files(folder) if volume_case(p.name) is not None]
    labels = [p for p in nifti if volume_case(p.name).lower().endswith(LABEL_SUFFIX)]
    volumes = [p for p in nifti if p not in labels]
    if labels:
        warnings.warn(f"--images {folder}: {len(labels)} label volume(s) (*{LABEL_SUFFIX}.nii[.gz], e.g. "
                      f"{labels[0].name}) are not segmented", stacklevel=2)
    if not volumes:
        raise DataError(f"--images {folder} holds no image volumes (.nii, .nii.gz) besides label volumes "
                        f"(*{LABEL_SUFFIX}); point --images at the image volumes")
    cases = [volume_case(p.name) for p in volumes]
    clashes = sorted(p.name for p, case in zip(volumes, cases, strict=True) if cases.count(case) > 1)
    if clashes:
        raise DataError(f"--images {folder}: {clashes} are one case; their masks would overwrite each other: "
                        "keep one file per case")
    return volumes


def read_volume_input(path: Path) -> VolumeInput:
    """The shape, affine and header of a 3-D or 4-D volume; :class:`DataError` naming the file otherwise."""
    try:
        proxy = nib.load(path)
        shape, affine, header = tuple(int(n) for n in proxy.shape), np.array(proxy.affine), proxy.header.copy()
    except _READ_ERRORS as error:
        raise DataError(f"cannot read image volume {path}: {error}; replace it with a valid NIfTI file "
                        "(.nii, .nii.gz)") from None
    if len(shape) not in (3, 4) or min(shape) < 1:
        raise DataError(f"image volume {path} has shape {shape}; expected 3-D (x, y, z) or 4-D "
                        "(x, y, z, modality) with no empty axis")
    return VolumeInput(Path(path), shape, affine, header)


def check_modality(volumes: list[VolumeInput], modality: int | None, folder: Path) -> None:
    """Refuse 4-D volumes without ``modality``, and a negative one; warn when no volume uses it.

    Raises
    ------
    DataError
        Naming each 4-D volume and its shape when ``modality`` is None.
    ValueError
        When ``modality`` is negative.
    """
    if modality is not None and modality < 0:
        raise ValueError(f"--modality {modality} must be >= 0: the channel of 4-D volumes to segment")
    four_d = [volume for volume in volumes if len(volume.shape) == 4]
    if modality is None and four_d:
        listed = "; ".join(f"{v.path} has shape {v.shape}" for v in four_d[:5]) + (" ..." if len(four_d) > 5 else "")
        channels = min(v.shape[3] for v in four_d)
        raise DataError(f"{len(four_d)} volume(s) in --images {folder} are 4-D (x, y, z, modality): {listed}; "
                        f"pass --modality N (0..{channels - 1}) to segment channel N, the contrast the model was "
                        "trained on (the Decathlon's Task05_Prostate: 0 = T2, 1 = ADC)")
    if modality is not None and volumes and not four_d:
        warnings.warn(f"--modality {modality} is unused: every volume in {folder} is 3-D and is segmented as it is",
                      stacklevel=2)


def label_header(source: VolumeInput, structures: tuple[str, ...], num_labels: int) -> nib.nifti1.Nifti1Header:
    """The input's header for a ``uint8`` label volume of values ``0..num_labels``.

    Spacing, orientation codes and units stay; the data type, scaling,
    intent (NIfTI ``label``), display range and description change.
    """
    header = source.header.copy()
    header.set_data_dtype(np.uint8)
    header.set_slope_inter(1.0, 0.0)
    header.set_intent("label")
    header["cal_min"], header["cal_max"] = 0, num_labels
    names = " ".join(f"{k}={name}" for k, name in enumerate(structures, start=1))
    header["descrip"] = f"fedsm predict {names}".strip()[:79].encode("ascii", "replace")
    return header


def write_label_volume(labels: np.ndarray, source: VolumeInput, structures: tuple[str, ...], path: Path,
                       num_labels: int) -> Path:
    """Write ``uint8 [x, y, z]`` labels on ``source``'s voxel grid (its affine and header) to ``path``."""
    if labels.shape != source.shape[:3] or labels.dtype != np.uint8:
        raise ValueError(f"labels of shape {labels.shape} ({labels.dtype}) do not fit {source.path}, whose voxel "
                         f"grid is {source.shape[:3]}; expected uint8 labels of that shape")
    image_class = nib.Nifti2Image if isinstance(source.header, nib.Nifti2Header) else nib.Nifti1Image
    nib.save(image_class(labels, source.affine, label_header(source, structures, num_labels)), path)
    return Path(path)
