"""Cases of a NIfTI prostate site: finding image/label pairs by case name, and reading them safely.

Two layouts (:data:`LAYOUTS`): ``multisite`` (``<site>/CaseNN.nii.gz`` with
``<site>/CaseNN_segmentation.nii.gz``) and ``msd`` (the Decathlon's
``imagesTr``/``labelsTr``). Images pair with labels by case name, never by
position; an unreadable file, a label with values other than 0, 1, 2, or an
image whose shape differs from its label's is a :class:`DataError` naming the file.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.filebasedimages import ImageFileError
from nibabel.spatialimages import HeaderDataError

from fedsm_core.data.files import ORPHAN_POLICIES, DataError, Pair, Pairing
from fedsm_core.data.masks import mask_encoding

LAYOUTS = {
    "multisite": "<site>/CaseNN.nii.gz with <site>/CaseNN_segmentation.nii.gz (or .nii)",
    "msd": "<site>/imagesTr/prostate_NN.nii.gz with <site>/labelsTr/prostate_NN.nii.gz (or .nii)",
}


SOURCE_NAMES = {"multisite": "prostate-nifti", "msd": "prostate-msd"}  # names in sources.py


NIFTI_SUFFIXES = (".nii.gz", ".nii")


LABEL_SUFFIX = "_segmentation"


LABELS = mask_encoding("label-map")  # 0 = background, 1 and 2 = prostate


_READ_ERRORS = (ImageFileError, HeaderDataError, OSError, EOFError, ValueError, zlib.error)


SPACING_UNITS_MM = {"meter": 1000.0, "mm": 1.0, "micron": 0.001}  # NIfTI xyz units -> mm


def _unreadable(kind: str, path: Path, error: Exception) -> DataError:
    return DataError(f"cannot read {kind} volume {path}: {error}; replace it with a valid NIfTI file (.nii, .nii.gz)")


def _nifti_stem(file_name: str) -> str | None:
    """The case name of a NIfTI file name (``Case00.nii.gz`` -> ``Case00``), else None."""
    lower = file_name.lower()
    suffix = next((s for s in NIFTI_SUFFIXES if lower.endswith(s)), None)
    return file_name[: -len(suffix)] if suffix else None


def _add(found: dict[str, Path], stem: str, path: Path) -> None:
    if stem in found:
        raise DataError(f"{found[stem]} and {path} are both the volume '{stem}'; keep one file per case")
    found[stem] = path


def _list_volumes(folder: Path, layout: str) -> dict[str, Path]:
    if not folder.is_dir():
        raise DataError(f"folder {folder} is missing; the '{layout}' layout expects {LAYOUTS[layout]}")
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        stem = _nifti_stem(path.name)
        if stem is not None and not path.name.startswith(".") and path.is_file():  # skips macOS ._*
            _add(found, stem, path)
    return found


def _case_of(path: Path, layout: str) -> str:
    stem = _nifti_stem(path.name) or path.name
    is_label = layout == "multisite" and stem.lower().endswith(LABEL_SUFFIX)
    return stem[: -len(LABEL_SUFFIX)] if is_label else stem


def _partner(orphan: Path, layout: str, want_label: bool) -> Path:
    """Where the missing image (``want_label=False``) or label of ``orphan`` would be."""
    case = _case_of(orphan, layout)
    suffix = orphan.name[len(_nifti_stem(orphan.name) or orphan.name):]
    if layout == "msd":
        return orphan.parent.parent / ("labelsTr" if want_label else "imagesTr") / f"{case}{suffix}"
    return orphan.parent / (f"{case}{LABEL_SUFFIX}{suffix}" if want_label else f"{case}{suffix}")


def find_cases(site_path: Path, layout: str = "multisite") -> Pairing:
    """Pair a site's image and label volumes by case name (``Pair.mask`` is the label), with the orphans.

    Raises :class:`DataError` if a folder of the layout is missing (the
    message shows the layout) or two files are one case (``a.nii``, ``a.nii.gz``).
    """
    check_nifti_options(layout, 0)
    site_path = Path(site_path)
    if not site_path.is_dir():
        raise DataError(f"site folder {site_path} does not exist; the '{layout}' layout expects {LAYOUTS[layout]}")
    if layout == "msd":
        images = _list_volumes(site_path / "imagesTr", layout)
        labels = _list_volumes(site_path / "labelsTr", layout)
    else:
        images, labels = {}, {}
        for stem, path in _list_volumes(site_path, layout).items():
            if stem.lower().endswith(LABEL_SUFFIX):
                _add(labels, _case_of(path, layout), path)
            else:
                _add(images, stem, path)
    common = sorted(images.keys() & labels.keys())
    return Pairing(pairs=tuple(Pair(stem, images[stem], labels[stem]) for stem in common),
                   images_without_mask=tuple(images[s] for s in sorted(images.keys() - labels.keys())),
                   masks_without_image=tuple(labels[s] for s in sorted(labels.keys() - images.keys())))


def describe_orphans(pairing: Pairing, layout: str) -> list[str]:
    """One line per orphan: the file and the partner it lacks."""
    lines = [f"{p} (image without label; expected {_partner(p, layout, True)})" for p in pairing.images_without_mask]
    return lines + [f"{p} (label without image; expected {_partner(p, layout, False)})"
                    for p in pairing.masks_without_image]


def read_label(path: Path) -> tuple[np.ndarray, list[int]]:
    """A label volume ``[X, Y, Z]`` as stored and the sorted values it holds.

    Raises :class:`DataError` naming the file when it cannot be read, is not
    3-D or holds non-integers; :func:`check_label_values` checks the values.
    """
    try:
        volume = np.asanyarray(nib.load(path).dataobj)
    except _READ_ERRORS as error:
        raise _unreadable("label", path, error) from None
    if volume.ndim == 4 and volume.shape[3] == 1:
        volume = volume[..., 0]
    if volume.ndim != 3:
        raise DataError(f"label volume {path} has shape {volume.shape}; a label must be 3-D (x, y, z)")
    present = np.unique(volume)
    if np.issubdtype(volume.dtype, np.floating) and not np.all(np.isfinite(present) & (present == np.round(present))):
        odd = [float(v) for v in present if not (np.isfinite(v) and v == np.round(v))]
        raise DataError(f"label volume {path} holds non-integer values {odd[:10]}; labels must be "
                        f"integers ({LABELS.description}); re-export it without interpolation")
    return volume, [int(v) for v in present]


def read_spacing(path: Path) -> tuple[float, float, float] | None:
    """The voxel size ``(x, y, z)`` in mm from a volume's header, or ``None`` when it gives no usable one.

    Zooms in metres or microns are converted; a header that leaves the unit unknown is read as millimetres,
    as ITK does (nibabel already replaces zero zooms by 1 with a warning when it loads the file).
    """
    try:
        header = nib.load(path).header
        zooms, (unit, _) = header.get_zooms()[:3], header.get_xyzt_units()
    except _READ_ERRORS as error:
        raise _unreadable("image", path, error) from None
    factor = SPACING_UNITS_MM.get(unit, 1.0)
    values = tuple(float(z) * factor for z in zooms)
    if len(values) != 3 or not all(np.isfinite(v) and v > 0 for v in values):
        return None
    return values  # type: ignore[return-value]


def check_label_values(values: list[int], path: Path) -> None:
    """Raise :class:`DataError` naming ``path`` if ``values`` leave the label-map encoding."""
    bad = [v for v in values if v not in LABELS.allowed]
    if bad:
        raise DataError(f"label volume {path} holds values {bad[:10]} (values found: {values[:12]}); allowed "
                        f"{list(LABELS.allowed)} ({LABELS.description}). Re-export the label without "
                        "interpolation, or map its values onto 0 = background and 1 = prostate")


def read_image(path: Path, modality: int = 0) -> np.ndarray:
    """An image volume ``[X, Y, Z]`` float32; a 4-D image gives its channel ``modality``.

    Only that channel is kept in memory. Raises :class:`DataError` naming the
    file when it cannot be read, has too few channels, or is not 3-D or 4-D.
    """
    try:
        image = nib.load(path)
        shape = image.shape
    except _READ_ERRORS as error:
        raise _unreadable("image", path, error) from None
    if len(shape) not in (3, 4):
        raise DataError(f"image volume {path} has shape {shape}; expected 3-D (x, y, z) or 4-D (x, y, z, modality)")
    if len(shape) == 4 and modality >= shape[3]:
        raise DataError(f"image volume {path} has {shape[3]} channel(s) on its 4th axis, so modality = "
                        f"{modality} does not exist; choose a modality in 0..{shape[3] - 1}")
    try:
        data = image.dataobj[..., modality] if len(shape) == 4 else image.dataobj[...]
        return np.asarray(data, dtype=np.float32)
    except _READ_ERRORS as error:
        raise _unreadable("image", path, error) from None


def describe_shape(shape: tuple[int, ...]) -> str:
    """A voxel shape as written in error messages."""
    return "x".join(str(n) for n in shape[:3])


def check_shapes(pair: Pair, image_shape: tuple[int, ...], label_shape: tuple[int, ...]) -> None:
    """Raise :class:`DataError` naming both files if their first three axes differ."""
    if tuple(image_shape[:3]) != tuple(label_shape[:3]):
        raise DataError(f"image {pair.image} is {describe_shape(image_shape)} but its label {pair.mask} is "
                        f"{describe_shape(label_shape)}; an image and its label must have the same voxel grid")


def check_nifti_options(layout: str, modality: int, empty_fraction: float = 0.0, on_orphans: str = "fail") -> None:
    """Refuse an unknown layout, a modality that is not a channel index, a bad empty fraction or orphan policy."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout = '{layout}' is unknown; NIfTI layouts: {sorted(LAYOUTS)}")
    if isinstance(modality, bool) or not isinstance(modality, (int, np.integer)) or modality < 0:
        raise ValueError(f"modality = {modality!r} must be an integer >= 0 (the channel of a 4-D image; "
                         "0 = T2 and 1 = ADC in the Decathlon's Task05_Prostate)")
    if not 0.0 <= float(empty_fraction) <= 1.0:
        raise ValueError(f"empty_fraction = {empty_fraction} must be in [0, 1] "
                         "(0 keeps only slices with prostate, 1 keeps every slice)")
    if on_orphans not in ORPHAN_POLICIES:
        raise ValueError(f"on_orphans = '{on_orphans}' must be one of {ORPHAN_POLICIES}")
