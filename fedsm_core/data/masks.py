"""Mask encodings of the public layouts: label values in a file -> binary targets.

Each encoding lists the values a mask file may contain and how they map to
the structures a model predicts (one output channel per structure). A value
outside the list is an error naming the file and the values found: a resized
or JPEG-compressed mask, or one from another encoding, would otherwise turn
into wrong targets without a sound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsm_core.data.files import DataError


@dataclass(frozen=True)
class MaskEncoding:
    """How one layout stores its labels.

    Attributes
    ----------
    name : str
        The name used in federation specs and on the command line.
    structures : tuple of str
        Target names, one output channel each.
    allowed : tuple of int
        Values a mask may contain.
    decode : callable
        ``decode(values [H, W] uint8) -> bool [K, H, W]``, K = len(structures).
    description : str
        The convention in words, for error messages and the docs.
    """

    name: str
    structures: tuple[str, ...]
    allowed: tuple[int, ...]
    decode: Callable[[np.ndarray], np.ndarray]
    description: str


def _dofe_fundus(values: np.ndarray) -> np.ndarray:
    # The disc is the rim plus the cup it encloses, as in the paper's targets.
    return np.stack([values <= 128, values == 0])


ENCODINGS: dict[str, MaskEncoding] = {
    encoding.name: encoding
    for encoding in (
        MaskEncoding("dofe-fundus", ("disc", "cup"), (0, 128, 255), _dofe_fundus,
                     "0 = optic cup, 128 = optic-disc rim, 255 = background; disc = rim + cup"),
        MaskEncoding("inverted-binary", ("prostate",), (0, 255), lambda v: (v == 0)[None],
                     "0 = structure, 255 = background"),
        MaskEncoding("binary", ("prostate",), (0, 255), lambda v: (v == 255)[None],
                     "255 = structure, 0 = background"),
        MaskEncoding("label-map", ("prostate",), (0, 1, 2), lambda v: (v > 0)[None],
                     "0 = background, 1 and 2 = structure (zones merged)"),
    )
}


def mask_encoding(name: str) -> MaskEncoding:
    """Look up an encoding by name; the error lists the known ones."""
    if name not in ENCODINGS:
        known = "; ".join(f"'{e.name}' ({e.description})" for e in ENCODINGS.values())
        raise ValueError(f"mask encoding '{name}' is unknown; known encodings: {known}")
    return ENCODINGS[name]


def unexpected_values(values: np.ndarray, encoding: MaskEncoding) -> list[int]:
    """Values in ``values`` the encoding does not allow (sorted)."""
    present = np.unique(values)
    return [int(v) for v in present if int(v) not in encoding.allowed]


def decode_mask(values: np.ndarray, encoding: MaskEncoding, source: Path | str) -> np.ndarray:
    """Binary targets ``bool [K, H, W]`` from a mask's label values.

    Raises
    ------
    DataError
        If ``values`` holds a value the encoding does not allow; the message
        names ``source``, the values found and the values expected.
    """
    bad = unexpected_values(values, encoding)
    if bad:
        shown = bad[:10] + (["..."] if len(bad) > 10 else [])
        raise DataError(
            f"mask {source} contains values {shown} outside the '{encoding.name}' encoding "
            f"({encoding.description}; allowed {list(encoding.allowed)}). Re-export the mask "
            "without interpolation or compression, or choose the matching mask encoding.")
    return encoding.decode(values)
