"""Finding, pairing and reading image/mask files of real datasets.

Images and masks are paired by file stem (the name without its extension),
never by position in a sorted listing: one missing or extra file would shift
every later pair onto the wrong mask without any error. Files without a
partner ("orphans") are reported by name.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
ORPHAN_POLICIES = ("fail", "skip")


class DataError(ValueError):
    """A problem in a user's data files; the message names the file and the fix."""


@dataclass(frozen=True)
class Pair:
    """One image and its mask, matched by ``stem``."""

    stem: str
    image: Path
    mask: Path


@dataclass(frozen=True)
class Pairing:
    """The pairs of two folders and the files that found no partner."""

    pairs: tuple[Pair, ...]
    images_without_mask: tuple[Path, ...] = field(default=())
    masks_without_image: tuple[Path, ...] = field(default=())

    @property
    def orphans(self) -> tuple[Path, ...]:
        """Every file without a partner."""
        return self.images_without_mask + self.masks_without_image

    def describe_orphans(self) -> str:
        """One line per orphan, saying what is missing."""
        lines = [f"  image without mask: {p}" for p in self.images_without_mask]
        lines += [f"  mask without image: {p}" for p in self.masks_without_image]
        return "\n".join(lines)


def list_images(folder: Path) -> dict[str, Path]:
    """Image files of ``folder`` by stem.

    Raises
    ------
    DataError
        If the folder is missing, or two files share a stem (``a.png`` and
        ``a.jpg``): which one belongs to the mask would be a guess.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"folder {folder} does not exist; check the data path and the expected layout")
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
            continue
        if path.stem in found:
            raise DataError(f"{found[path.stem]} and {path} share the stem '{path.stem}'; "
                            "keep one file per image name")
        found[path.stem] = path
    return found


def pair_by_stem(image_dir: Path, mask_dir: Path, on_orphans: str = "fail", mask_suffix: str = "") -> Pairing:
    """Pair the images of ``image_dir`` with the masks of ``mask_dir`` by file stem.

    Parameters
    ----------
    image_dir, mask_dir : Path
        Folders of image files (see :data:`IMAGE_SUFFIXES`).
    on_orphans : {"fail", "skip"}
        ``"fail"`` raises :class:`DataError` listing every orphan; ``"skip"``
        leaves them out with a warning that lists them.
    mask_suffix : str
        Removed from mask stems before matching (``"_mask"`` pairs
        ``case1.png`` with ``case1_mask.png``).

    Returns
    -------
    Pairing
        Pairs sorted by stem, plus the orphans.
    """
    if on_orphans not in ORPHAN_POLICIES:
        raise ValueError(f"on_orphans = '{on_orphans}' must be one of {ORPHAN_POLICIES}")
    images = list_images(image_dir)
    masks = {_strip(stem, mask_suffix): path for stem, path in list_images(mask_dir).items()}
    common = sorted(images.keys() & masks.keys())
    pairing = Pairing(
        pairs=tuple(Pair(stem, images[stem], masks[stem]) for stem in common),
        images_without_mask=tuple(images[s] for s in sorted(images.keys() - masks.keys())),
        masks_without_image=tuple(masks[s] for s in sorted(masks.keys() - images.keys())),
    )
    if pairing.orphans:
        message = (f"{len(pairing.orphans)} file(s) in {image_dir} / {mask_dir} have no partner "
                   f"(images and masks are paired by file name):\n{pairing.describe_orphans()}")
        if on_orphans == "fail":
            raise DataError(message + "\nAdd the missing files, remove the extra ones, "
                            "or set on-orphans = \"skip\" to leave them out.")
        warnings.warn(message + "\nThese files are left out (on-orphans = \"skip\").", stacklevel=2)
    return pairing


def _strip(stem: str, suffix: str) -> str:
    return stem[: -len(suffix)] if suffix and stem.endswith(suffix) else stem


def read_image(path: Path, mode: str = "RGB", scale_deep: bool = True) -> np.ndarray:
    """Read an image file as ``uint8`` ``[H, W, C]`` (``mode="RGB"``) or ``[H, W]`` (``"L"``).

    Grey files read as RGB repeat the grey value in all three channels. Files
    of 16-bit depth are scaled to 8 bits; with ``scale_deep=False`` (label
    values of masks) their values are kept and must lie in 0-255.

    Raises
    ------
    DataError
        Naming the file when it cannot be decoded.
    """
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode in ("I;16", "I;16B", "I"):
                array = np.asarray(image, dtype=np.float64)
                if not scale_deep:
                    if array.min() < 0 or array.max() > 255:
                        raise DataError(f"mask {path} holds values {int(array.min())}..{int(array.max())} "
                                        "beyond 0-255; save the mask with the label values of its encoding")
                    image = Image.fromarray(array.astype(np.uint8))
                else:
                    peak = max(float(array.max()), 1.0)
                    image = Image.fromarray(np.round(array * (255.0 / peak)).astype(np.uint8))
            return np.asarray(image.convert(mode), dtype=np.uint8)
    except DataError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise DataError(f"cannot read image {path}: {error}; replace the file with a valid "
                        f"{', '.join(IMAGE_SUFFIXES)} image") from None


def read_mask_values(path: Path) -> np.ndarray:
    """Read a mask file as ``uint8`` ``[H, W]``; RGB masks must be grey (R = G = B).

    Raises
    ------
    DataError
        When the file cannot be decoded, a 16-bit mask holds values above
        255, or an RGB mask has colour.
    """
    rgb = read_image(path, mode="RGB", scale_deep=False)  # label values are never rescaled
    grey = rgb[..., 0]
    if not (np.array_equal(grey, rgb[..., 1]) and np.array_equal(grey, rgb[..., 2])):
        raise DataError(f"mask {path} has colour (R, G and B differ); masks must be single-channel "
                        "or grey RGB with the label values of the mask encoding")
    return grey
