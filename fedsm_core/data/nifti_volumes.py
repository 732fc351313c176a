"""Prostate MRI sites stored as NIfTI volumes, cut into 2-D axial slices.

Two layouts of one site folder:

* ``multisite`` (the multi-site prostate data of Liu et al., MS-Net / SAML):
  ``<site>/CaseNN.nii.gz`` with its label ``<site>/CaseNN_segmentation.nii.gz``
  (``.nii`` too; the ``_segmentation`` suffix matches in any case, as some
  sites write ``Case00_Segmentation.nii.gz``).
* ``msd`` (Medical Segmentation Decathlon, Task05_Prostate):
  ``<site>/imagesTr/prostate_NN.nii.gz`` (4-D: x, y, z, modality with
  0 = T2, 1 = ADC) and ``<site>/labelsTr/prostate_NN.nii.gz`` (3-D). Files
  whose name starts with a dot (macOS ``._*``) are ignored; so is ``imagesTs``.

Images pair with labels by case name, never by position. Labels hold
0 = background and 1, 2 = prostate (the Decathlon's peripheral and
transition zones), merged into one target (the ``label-map`` encoding).
A 4-D image contributes one channel, ``modality``; a 3-D image is used as is.

Cases, not slices, are split into train/validation/test
(:data:`SPLIT_WEIGHTS`), seeded by the data seed and the site name, so no
patient appears in two splits. Slices run along the third voxel axis and
keep the stored orientation (rows = first voxel axis, columns = second; no
reorientation to RAS): every site is seen as its scanner wrote it. Every
slice with prostate is kept, plus each empty slice with probability
``empty_fraction``. Slice ids read ``"<site>/<case>/z012"``.
"""

from __future__ import annotations

import warnings
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.filebasedimages import ImageFileError
from nibabel.spatialimages import HeaderDataError

from fedsm_core.data.arrays import SegArrays, SiteSplits
from fedsm_core.data.doctor_report import SiteReport, SplitReport
from fedsm_core.data.files import ORPHAN_POLICIES, DataError, Pair, Pairing
from fedsm_core.data.masks import mask_encoding
from fedsm_core.data.preprocess import prepare_example, stack_examples

LAYOUTS = {
    "multisite": "<site>/CaseNN.nii.gz with <site>/CaseNN_segmentation.nii.gz (or .nii)",
    "msd": "<site>/imagesTr/prostate_NN.nii.gz with <site>/labelsTr/prostate_NN.nii.gz (or .nii)",
}
SOURCE_NAMES = {"multisite": "prostate-nifti", "msd": "prostate-msd"}  # names in sources.py
NIFTI_SUFFIXES = (".nii.gz", ".nii")
LABEL_SUFFIX = "_segmentation"
LABELS = mask_encoding("label-map")  # 0 = background, 1 and 2 = prostate
# Cases per split: train/val/test = 2:1:1, i.e. 0.5/0.25/0.25 of a site's cases.
SPLIT_WEIGHTS = {"train": 2, "val": 1, "test": 1}
# Empty slices kept, as a probability per slice: a few teach the model that
# slices without prostate exist, without drowning the foreground.
DEFAULT_EMPTY_FRACTION = 0.1
_READ_ERRORS = (ImageFileError, HeaderDataError, OSError, EOFError, ValueError, zlib.error)


def _unreadable(kind: str, path: Path, error: Exception) -> DataError:
    return DataError(f"cannot read {kind} volume {path}: {error}; replace it with a valid NIfTI file (.nii, .nii.gz)")


def _check_options(layout: str, modality: int, empty_fraction: float = 0.0, on_orphans: str = "fail") -> None:
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
    _check_options(layout, 0)
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


def _size(shape: tuple[int, ...]) -> str:
    return "x".join(str(n) for n in shape[:3])


def check_shapes(pair: Pair, image_shape: tuple[int, ...], label_shape: tuple[int, ...]) -> None:
    """Raise :class:`DataError` naming both files if their first three axes differ."""
    if tuple(image_shape[:3]) != tuple(label_shape[:3]):
        raise DataError(f"image {pair.image} is {_size(image_shape)} but its label {pair.mask} is "
                        f"{_size(label_shape)}; an image and its label must have the same voxel grid")


def split_counts(num_cases: int) -> dict[str, int]:
    """Cases per split for :data:`SPLIT_WEIGHTS` (largest remainders; train first, then test).

    Train always gets at least one case: 1 case -> train only (validation and
    test empty); 2 cases -> 1 train, 1 test, validation empty; 3 -> 1/1/1;
    4 -> 2/1/1; 5 -> 3/1/1; 6 -> 3/1/2.
    """
    total = sum(SPLIT_WEIGHTS.values())
    counts = {split: num_cases * w // total for split, w in SPLIT_WEIGHTS.items()}
    priority = {"train": 0, "test": 1, "val": 2}
    by_remainder = sorted(SPLIT_WEIGHTS, key=lambda s: (-(num_cases * SPLIT_WEIGHTS[s] % total), priority[s]))
    for split in by_remainder[: num_cases - sum(counts.values())]:
        counts[split] += 1
    return counts


def split_cases(cases: list[str], seed: int, salt: str) -> dict[str, list[str]]:
    """Whole cases into ``train``/``val``/``test``, seeded by ``seed`` and ``salt`` (the site name).

    The draw depends only on the sorted case names, never on listing order.
    """
    ordered = sorted(set(cases))
    shuffled = [ordered[i] for i in np.random.default_rng([seed, *salt.encode()]).permutation(len(ordered))]
    splits, start = {}, 0
    for split, count in split_counts(len(ordered)).items():
        splits[split], start = sorted(shuffled[start:start + count]), start + count
    return splits


def select_slices(label: np.ndarray, empty_fraction: float, seed: int, salt: str) -> list[int]:
    """Slice indices (third axis) to keep: all with foreground, each empty one with probability ``empty_fraction``."""
    has_foreground = (label > 0).any(axis=(0, 1))
    keep_empty = np.random.default_rng([seed, *salt.encode()]).random(label.shape[2]) < empty_fraction
    return np.flatnonzero(has_foreground | keep_empty).tolist()


def _case_examples(pair: Pair, site: str, image_size: int, seed: int, modality: int,
                   empty_fraction: float) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[str]]:
    label, values = read_label(pair.mask)
    check_label_values(values, pair.mask)
    image = read_image(pair.image, modality)
    check_shapes(pair, image.shape, label.shape)
    slices = select_slices(label, empty_fraction, seed, f"{site}/{pair.stem}")
    examples = [prepare_example(image[:, :, z], LABELS.decode(label[:, :, z]), image_size) for z in slices]
    return examples, [f"{site}/{pair.stem}/z{z:03d}" for z in slices]


def load_nifti_site(site_path: Path, image_size: int, seed: int = 0, *, layout: str = "multisite",
                    modality: int = 0, empty_fraction: float = DEFAULT_EMPTY_FRACTION,
                    on_orphans: str = "fail", name: str | None = None) -> SiteSplits:
    """Load one site of NIfTI volumes as train/validation/test slice arrays.

    Parameters
    ----------
    site_path : Path
        The site's folder (see the module docstring for the layouts).
    image_size : int
        Side of the square slices (images: area/bilinear, masks: nearest).
    seed : int
        Seeds the split of cases and the choice of empty slices (salted by
        the site name, so sites differ).
    layout : {"multisite", "msd"}
        Folder structure of the site.
    modality : int
        Channel of 4-D images (Decathlon: 0 = T2, 1 = ADC); 3-D images are used as is.
    empty_fraction : float
        Probability of keeping each slice without prostate, in ``[0, 1]``;
        0 keeps only slices with prostate, 1 keeps every slice.
    on_orphans : {"fail", "skip"}
        ``"fail"`` raises listing images without a label and labels without
        an image; ``"skip"`` leaves them out with a warning that lists them.
    name : str, optional
        Site name for ids and the seed; the folder name when omitted.

    Raises
    ------
    DataError
        For missing folders, orphans (``"fail"``), unreadable files, shape
        mismatches, label values outside 0/1/2, or a site without cases.
    """
    _check_options(layout, modality, empty_fraction, on_orphans)
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < 1:
        raise ValueError(f"image_size = {image_size!r} must be a positive integer")
    site = name or Path(site_path).name
    pairing = find_cases(site_path, layout)
    if pairing.orphans:
        listed = "\n".join(f"  {line}" for line in describe_orphans(pairing, layout))
        message = f"{len(pairing.orphans)} volume(s) in {site_path} have no partner (paired by case name):\n{listed}"
        if on_orphans == "fail":
            raise DataError(message + "\nAdd the missing files, remove the extra ones, or set "
                            "on-orphans = \"skip\" to leave them out.")
        warnings.warn(message + "\nThese files are left out (on-orphans = \"skip\").", stacklevel=2)
    if not pairing.pairs:
        raise DataError(f"site {site_path} has no image/label pairs; the '{layout}' layout expects {LAYOUTS[layout]}")
    by_case = {pair.stem: pair for pair in pairing.pairs}
    arrays: dict[str, SegArrays] = {}
    for split, cases in split_cases(list(by_case), seed, site).items():
        examples, ids = [], []
        for case in cases:
            case_examples, case_ids = _case_examples(by_case[case], site, image_size, seed, modality, empty_fraction)
            examples += case_examples
            ids += case_ids
        arrays[split] = stack_examples(examples, ids, len(LABELS.structures), image_size)
    if not len(arrays["train"]):
        raise DataError(f"site {site_path} has no training slices: the label volumes of its train cases are empty "
                        f"and empty_fraction = {empty_fraction}; check the labels or raise empty_fraction")
    return SiteSplits(site, arrays["train"], arrays["val"], arrays["test"])


def _inspect_case(pair: Pair, modality: int, result: SplitReport) -> None:
    problems, image, label, values = [], None, None, []
    try:
        image = read_image(pair.image, modality)
        result.sizes[_size(image.shape)] += 1
    except DataError as error:
        problems.append(str(error))
    try:
        label, values = read_label(pair.mask)
        result.mask_values.update(values)
        check_label_values(values, pair.mask)
    except DataError as error:
        problems.append(str(error))
    if image is not None and label is not None:
        try:
            check_shapes(pair, image.shape, label.shape)
        except DataError as error:
            problems.append(str(error))
    result.errors += problems
    if not problems:
        result.count += 1
        if not any(v > 0 for v in values):
            result.empty_masks.append(str(pair.mask))


def inspect_nifti_site(site_path: Path, *, layout: str = "multisite", modality: int = 0,
                       name: str | None = None) -> SiteReport:
    """Check one site of NIfTI volumes for the data doctor; never raises for data problems.

    Reads every volume the loader would read (the ``modality`` channel of
    4-D images) and reports, in one split named ``"volumes"``: usable cases,
    volume sizes ``"XxYxZ"``, label values, cases with an empty label, orphans
    and errors (missing folders, unreadable files, shape mismatches, label
    values outside 0/1/2). Raises ``ValueError`` only for bad arguments.
    """
    _check_options(layout, modality)
    result = SplitReport("volumes")
    report = SiteReport(name or Path(site_path).name, str(site_path), SOURCE_NAMES[layout], [result])
    try:
        pairing = find_cases(site_path, layout)
    except DataError as error:
        result.errors.append(str(error))
        return report
    result.orphans += describe_orphans(pairing, layout)
    for pair in pairing.pairs:
        _inspect_case(pair, modality, result)
    if not pairing.pairs and not result.orphans:
        result.errors.append(f"site {site_path} has no NIfTI volumes; the '{layout}' layout expects {LAYOUTS[layout]}")
    return report
