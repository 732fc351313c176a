"""In-memory segmentation arrays shared by every dataset of the package."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


# eq=False: the generated __eq__/__hash__ would compare NumPy arrays elementwise
# and fail; identity semantics are the only well-defined ones here.
@dataclass(frozen=True, eq=False)
class SegArrays:
    """Images, binary masks and ids of one split.

    Attributes
    ----------
    images : np.ndarray
        float32 ``[N, C, H, W]`` with values in ``[0, 1]`` (C = 3 for RGB).
    masks : np.ndarray
        float32 ``[N, K, H, W]`` with values exactly 0.0 or 1.0.
    ids : tuple of str
        One id per image, e.g. ``"site-3/0007"``.
    spacings : mapping of str to (float, float, float)
        Voxel spacing in mm, ``(dz, dy, dx)``, of each case (keyed by
        :func:`fedsm_core.data.cases.named_case` of its slices' ids) as its slices
        are stacked for per-case scores: the slice step across, the pixels of the
        resized slices in-plane. Empty where the source gives none (fundus images,
        PNG slices); a subset may keep entries of cases it no longer holds.
    """

    images: np.ndarray
    masks: np.ndarray
    ids: tuple[str, ...]
    spacings: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.masks.ndim != 4:
            raise ValueError(
                f"SegArrays: images and masks must be 4-D [N, C, H, W], got "
                f"{self.images.shape} and {self.masks.shape}"
            )
        n, _, h, w = self.images.shape
        if self.masks.shape[0] != n or self.masks.shape[2:] != (h, w) or len(self.ids) != n:
            raise ValueError(
                f"SegArrays: inconsistent sizes: images {self.images.shape}, "
                f"masks {self.masks.shape}, {len(self.ids)} ids"
            )

    def __len__(self) -> int:
        return int(self.images.shape[0])


def merged_spacings(parts: Sequence[SegArrays]) -> dict[str, tuple[float, float, float]]:
    """The case spacings of several splits in one mapping (cases are site-qualified, so none collide)."""
    return {case: spacing for part in parts for case, spacing in part.spacings.items()}


@dataclass(frozen=True, eq=False)
class SiteSplits:
    """Train/validation/test splits of one site (one federated client)."""

    name: str
    train: SegArrays
    val: SegArrays
    test: SegArrays
