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
from pathlib import Path

import numpy as np

from fedsm_core.data.arrays import SegArrays, SiteSplits
from fedsm_core.data.doctor_report import SiteReport, SplitReport
from fedsm_core.data.files import DataError, Pair
from fedsm_core.data.nifti_cases import (
    LABELS,
    LAYOUTS,
    SOURCE_NAMES,
    check_label_values,
    check_nifti_options,
    check_shapes,
    describe_orphans,
    describe_shape,
    find_cases,
    read_image,
    read_label,
    read_spacing,
)
from fedsm_core.data.preprocess import prepare_example, stack_examples

# Cases per split: train/val/test = 2:1:1, i.e. 0.5/0.25/0.25 of a site's cases.
SPLIT_WEIGHTS = {"train": 2, "val": 1, "test": 1}
# Empty slices kept, as a probability per slice: a few teach the model that
# slices without prostate exist, without drowning the foreground.
DEFAULT_EMPTY_FRACTION = 0.1


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


def stacked_spacing(voxel: tuple[float, float, float], shape: tuple[int, ...],
                    image_size: int) -> tuple[float, float, float]:
    """``(dz, dy, dx)`` in mm of a case's slices as scored: each ``[X, Y]`` slice resized to ``image_size``².

    ``voxel`` is the header's ``(x, y, z)`` size; rows are the first voxel axis, columns the second.
    """
    (sx, sy, sz), (nx, ny) = voxel, shape[:2]
    return sz, sx * nx / image_size, sy * ny / image_size


def _case_examples(pair: Pair, site: str, image_size: int, seed: int, modality: int, empty_fraction: float
                   ) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[str], tuple[float, float, float] | None]:
    label, values = read_label(pair.mask)
    check_label_values(values, pair.mask)
    image = read_image(pair.image, modality)
    check_shapes(pair, image.shape, label.shape)
    slices = select_slices(label, empty_fraction, seed, f"{site}/{pair.stem}")
    examples = [prepare_example(image[:, :, z], LABELS.decode(label[:, :, z]), image_size) for z in slices]
    voxel = read_spacing(pair.image)
    spacing = stacked_spacing(voxel, image.shape, image_size) if voxel else None
    return examples, [f"{site}/{pair.stem}/z{z:03d}" for z in slices], spacing


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
    check_nifti_options(layout, modality, empty_fraction, on_orphans)
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
        examples, ids, spacings = [], [], {}
        for case in cases:
            case_examples, case_ids, spacing = _case_examples(by_case[case], site, image_size, seed, modality,
                                                              empty_fraction)
            examples += case_examples
            ids += case_ids
            if spacing is not None:
                spacings[f"{site}/{case}"] = spacing
        arrays[split] = stack_examples(examples, ids, len(LABELS.structures), image_size, spacings)
    if not len(arrays["train"]):
        raise DataError(f"site {site_path} has no training slices: the label volumes of its train cases are empty "
                        f"and empty_fraction = {empty_fraction}; check the labels or raise empty_fraction")
    return SiteSplits(site, arrays["train"], arrays["val"], arrays["test"])


def _inspect_case(pair: Pair, modality: int, result: SplitReport) -> None:
    problems, image, label, values = [], None, None, []
    try:
        image = read_image(pair.image, modality)
        result.sizes[describe_shape(image.shape)] += 1
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
    check_nifti_options(layout, modality)
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
