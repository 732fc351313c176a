"""Sites stored as PNG (or JPEG, BMP, TIFF) files in the public multi-site layouts.

* ``fundus-dofe`` (the DoFE / FedDG "Fundus" layout):
  ``<site>/{train,test}/ROIs/{image,mask}/<name>.png``; RGB images, masks
  grey or grey RGB with 0 = cup, 128 = disc rim, 255 = background; two
  targets, disc (rim + cup) and cup.
* ``prostate-slices`` (the "ProstateSlice" layout):
  ``<site>/{train,test}/{image,mask}/<name>.png``; grey slices, masks
  0 = prostate, 255 = background by default (``inverted-binary``); other
  encodings are an option.

Images and masks pair by file name. The layout's ``train`` folder is split
into train and validation by whole cases (:data:`VAL_FRACTION` of the cases,
seeded by the data seed and the site name; the case of a file comes from its
name, :mod:`fedsm_core.data.cases`); ``test`` is the test split.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.cases import (
    CASE_PATTERNS,
    EACH_FILE,
    VAL_SPLITS,
    case_of,
    compile_case_pattern,
    split_cases_off,
)
from fedsm_core.data.files import DataError, Pair, Pairing, pair_by_stem, read_image, read_mask_values
from fedsm_core.data.masks import MaskEncoding, decode_mask, mask_encoding
from fedsm_core.data.preprocess import prepare_example, stack_examples

VAL_FRACTION = 0.2
SPLITS = ("train", "test")


@dataclass(frozen=True)
class PngLayout:
    """Folder structure and label convention of one layout."""

    name: str
    subdir: str  # between the split folder and image/mask ("ROIs" in DoFE)
    encoding: str  # default mask encoding
    image_mode: str  # "RGB" or "L" (grey)

    def folders(self, site_path: Path, split: str) -> tuple[Path, Path]:
        """The image and mask folders of ``split``."""
        base = Path(site_path) / split / self.subdir if self.subdir else Path(site_path) / split
        return base / "image", base / "mask"

    def expected(self) -> str:
        """The layout in words, for error messages."""
        middle = f"/{self.subdir}" if self.subdir else ""
        return f"<site>/{{train,test}}{middle}/{{image,mask}}/<name>.png"


LAYOUTS: dict[str, PngLayout] = {
    "fundus-dofe": PngLayout("fundus-dofe", "ROIs", "dofe-fundus", "RGB"),
    "prostate-slices": PngLayout("prostate-slices", "", "inverted-binary", "L"),
}


def png_layout(name: str) -> PngLayout:
    """Look up a layout by name; the error lists the known ones."""
    if name not in LAYOUTS:
        raise ValueError(f"layout '{name}' is unknown; PNG layouts: {sorted(LAYOUTS)}")
    return LAYOUTS[name]


def pair_split(site_path: Path, layout: PngLayout, split: str, on_orphans: str = "fail") -> Pairing:
    """Pair the images and masks of one split folder by file name.

    Raises
    ------
    DataError
        If a folder of the layout is missing (the message shows the expected
        layout) or, with ``on_orphans="fail"``, if a file has no partner.
    """
    image_dir, mask_dir = layout.folders(site_path, split)
    for folder in (image_dir, mask_dir):
        if not folder.is_dir():
            raise DataError(f"folder {folder} is missing; the '{layout.name}' layout expects "
                            f"{layout.expected()} under each site folder")
    return pair_by_stem(image_dir, mask_dir, on_orphans=on_orphans)


def read_pair(pair: Pair, layout: PngLayout, encoding: MaskEncoding) -> tuple[np.ndarray, np.ndarray]:
    """Image ``uint8`` and targets ``bool [K, H, W]`` of one pair, checked.

    Raises
    ------
    DataError
        For an unreadable file, a mask value outside ``encoding`` or an image
        and mask of different sizes.
    """
    image = read_image(pair.image, layout.image_mode)
    values = read_mask_values(pair.mask)
    if image.shape[:2] != values.shape:
        raise DataError(f"image {pair.image} is {image.shape[1]}x{image.shape[0]} but its mask {pair.mask} "
                        f"is {values.shape[1]}x{values.shape[0]}; an image and its mask must have the same size")
    return image, decode_mask(values, encoding, pair.mask)


def load_png_site(site_path: Path, layout_name: str, image_size: int, seed: int = 0, *,
                  encoding: str | None = None, on_orphans: str = "fail", name: str | None = None,
                  case_pattern: str | None = None, val_split: str = "case") -> SiteSplits:
    """Load one site of a PNG layout as train/validation/test arrays.

    Parameters
    ----------
    site_path : Path
        The site's folder (holding ``train`` and ``test``).
    layout_name : str
        A key of :data:`LAYOUTS`.
    image_size : int
        Side of the square arrays (images: area/bilinear, masks: nearest).
    seed : int
        Seeds the train/validation split.
    encoding : str, optional
        Mask encoding; the layout's default when omitted.
    on_orphans : {"fail", "skip"}
        What to do with images without masks and masks without images.
    name : str, optional
        Site name for ids; the folder name when omitted.
    case_pattern : str, optional
        Regular expression whose first group is a file's case (the layout's
        default of :data:`fedsm_core.data.cases.CASE_PATTERNS` when omitted).
        Ids are ``<site>/<case>/<name>``, or ``<site>/<name>`` when a file is
        its own case.
    val_split : {"case", "file"}
        How validation is drawn from ``train``: whole cases (slices of one
        patient never on both sides), or single files, for a train folder of
        one case; the ids keep their case either way, so the test split is
        still scored per case.
    """
    layout = png_layout(layout_name)
    pattern = compile_case_pattern(case_pattern or CASE_PATTERNS[layout.name], f"site {site_path}")
    decoder = mask_encoding(encoding or layout.encoding)
    site = name or Path(site_path).name
    pairs = {split: {p.stem: p for p in pair_split(site_path, layout, split, on_orphans).pairs} for split in SPLITS}
    if not pairs["train"]:
        raise DataError(f"site {site_path} has no image/mask pairs in its train folder; "
                        f"expected {layout.expected()}")
    train_folder = layout.folders(site_path, "train")[0]
    if val_split not in VAL_SPLITS:
        raise ValueError(f"site {site_path}: val-split = {val_split!r} must be one of {list(VAL_SPLITS)}")
    by = pattern if val_split == "case" else EACH_FILE
    train, val = split_cases_off(list(pairs["train"]), by, VAL_FRACTION, seed, site, train_folder)
    chosen = {"train": (train, pairs["train"]), "val": (val, pairs["train"]),
              "test": (sorted(pairs["test"]), pairs["test"])}
    arrays = {}
    for split, (stems, by_stem) in chosen.items():
        examples = [prepare_example(*read_pair(by_stem[s], layout, decoder), image_size) for s in stems]
        ids = [_example_id(site, stem, pattern, by_stem[stem].image.parent) for stem in stems]
        arrays[split] = stack_examples(examples, ids, len(decoder.structures), image_size)
    return SiteSplits(site, arrays["train"], arrays["val"], arrays["test"])


def _example_id(site: str, stem: str, pattern, folder: Path) -> str:
    case = case_of(stem, pattern, folder)
    return f"{site}/{stem}" if case == stem else f"{site}/{case}/{stem}"
