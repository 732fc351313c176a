"""The data doctor: check a site's files before training and say what is wrong.

It reads every file the loader would read and collects problems instead of
stopping at the first: missing folders, orphans, unreadable files, mask values
outside the encoding, image/mask size mismatches, and (as warnings) empty
masks. ``fedsm check-data`` prints the reports and exits non-zero on errors.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from fedsm_core.data.doctor_report import SiteReport, SplitReport
from fedsm_core.data.files import DataError, Pair, read_image, read_mask_values
from fedsm_core.data.masks import MaskEncoding, mask_encoding, unexpected_values
from fedsm_core.data.png_layouts import SPLITS, PngLayout, pair_split, png_layout


def inspect_png_site(site_path: Path, layout_name: str, encoding: str | None = None,
                     name: str | None = None) -> SiteReport:
    """Check one site folder of a PNG layout; problems go into the report, never raise."""
    layout = png_layout(layout_name)
    decoder = mask_encoding(encoding or layout.encoding)
    site_path = Path(site_path)
    report = SiteReport(name or site_path.name, str(site_path), layout.name)
    if not site_path.is_dir():
        report.errors.append(f"site folder {site_path} does not exist; expected {layout.expected()}")
        return report
    for split in SPLITS:
        report.splits.append(_inspect_split(site_path, layout, decoder, split))
    return report


def _inspect_split(site_path: Path, layout: PngLayout, decoder: MaskEncoding, split: str) -> SplitReport:
    result = SplitReport(split)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # orphans are reported below, not warned about
            pairing = pair_split(site_path, layout, split, on_orphans="skip")
    except DataError as error:
        result.errors.append(str(error))
        return result
    result.orphans += [f"{p} (image without mask)" for p in pairing.images_without_mask]
    result.orphans += [f"{p} (mask without image)" for p in pairing.masks_without_image]
    for pair in pairing.pairs:
        _inspect_pair(pair, layout, decoder, result)
    return result


def _inspect_pair(pair: Pair, layout: PngLayout, decoder: MaskEncoding, result: SplitReport) -> None:
    try:
        image = read_image(pair.image, layout.image_mode)
        values = read_mask_values(pair.mask)
    except DataError as error:
        result.errors.append(str(error))
        return
    result.sizes[f"{image.shape[1]}x{image.shape[0]}"] += 1
    result.mask_values.update(int(v) for v in np.unique(values))
    problems = []
    if image.shape[:2] != values.shape:
        problems.append(f"image {pair.image} is {image.shape[1]}x{image.shape[0]} but its mask is "
                        f"{values.shape[1]}x{values.shape[0]}; they must have the same size")
    bad = unexpected_values(values, decoder)
    if bad:
        problems.append(f"mask {pair.mask} has values {bad[:10]} outside the '{decoder.name}' encoding "
                        f"({decoder.description})")
    if problems:
        result.errors += problems
        return
    result.count += 1
    if not decoder.decode(values).any():
        result.empty_masks.append(str(pair.mask))


def site_folders(root: Path) -> list[Path]:
    """Site folders under ``root`` (every non-hidden sub-folder), sorted by name.

    Raises
    ------
    DataError
        If ``root`` is missing or holds no folder.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data root {root} does not exist; pass the folder that holds one folder per site")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise DataError(f"data root {root} holds no site folders; expected one folder per site")
    return folders
