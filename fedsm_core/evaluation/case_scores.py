r"""Per-case scores: the slices of one case (patient) stacked into a volume, 3-D Dice and HD95.

The paper scores prostate MRI per 2-D slice (``dice-*``, :mod:`fedsm_core.metrics`):
the "slice Dice (paper)". Prostate studies usually score per patient, so for
splits whose example ids carry a case (:func:`fedsm_core.data.cases.named_case`:
``"<site>/<case>/z012"`` from NIfTI volumes, ``"<site>/<case>/<name>"`` from slice
layouts whose ``case-pattern`` groups files) the evaluation also reports the
"per-case 3-D Dice" and HD95 computed here. Images without a case (fundus
``"<site>/0007"``) get none: :func:`case_metrics` returns nothing for them.

**Volume.** A case's slices are placed along the first axis at their slice
numbers (the trailing digits of the id, :func:`fedsm_core.data.cases.slice_number`),
from the lowest to the highest; a position without an evaluated slice (a loader
keeps only some empty slices, ``empty-fraction``) is empty in target and
prediction. When some slice has no number, or two share one, the slices are
stacked in id order instead. Shape ``[C, Z, H, W]``.

**Dice.** Per structure over the whole volume, ``2 |P & Y| / (|P| + |Y|)``, and
the mean over structures, as :func:`fedsm_core.metrics.dice_per_image` does
for an image. A case whose target volume is empty scores 1 when the
prediction is empty too (0 otherwise) but, as empty images in
:mod:`fedsm_core.metrics`, is left out of the means and counted apart
(``num-empty-cases``).

**HD95** (the definition of MONAI's ``compute_hausdorff_distance`` with
``percentile=95``). The surface of a mask is the mask minus its erosion
(6-connected; outside the volume counts as background); every surface voxel
of one mask gets its Euclidean distance to the nearest surface voxel of the
other (``scipy.ndimage.distance_transform_edt`` with ``sampling = spacing``);
HD95 is the larger of the two directed 95th percentiles (linear
interpolation). ``case-hd95-*`` is in voxels (pixels of the resized slices
in-plane, one slice step across); where every case of the split has a
spacing (:attr:`fedsm_core.data.arrays.SegArrays.spacings`: NIfTI headers, the
generated prostate cases), ``case-hd95-mm-*`` gives the same distance in
millimetres.
It is undefined (NaN) when the prediction or the target of a structure is
empty; a case's HD95 is the mean over its structures where it is defined.
A case with foreground whose HD95 is undefined (the model found nothing of
it) is left out of the HD95 mean and counted (``num-missed-cases-<model>``).

Metric keys, per model (``global``, ``personal``, ``super``): ``case-dice-<model>``
(mean over cases with foreground), ``case-hd95-<model>`` and ``case-hd95-mm-<model>``
(means over those with a defined HD95), ``num-missed-cases-<model>``; per split:
``num-cases``, ``num-empty-cases``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage

from fedsm_core.data.cases import named_case, slice_number
from fedsm_core.metrics import dice_per_structure

CASE_DICE = "case-dice-"  # a mean over cases with foreground
CASE_HD95 = "case-hd95-"  # a mean over cases with a defined HD95, in voxels
CASE_HD95_MM = "case-hd95-mm-"  # the same in mm, where every case has a spacing
NUM_CASES = "num-cases"
NUM_EMPTY_CASES = "num-empty-cases"
NUM_MISSED = "num-missed-cases-"  # cases with foreground where the model's HD95 is undefined


@dataclass(frozen=True)
class CaseScore:
    """One model's scores on one case: 3-D Dice, HD95, and whether the target has foreground."""

    case: str
    dice: float
    hd95: float
    foreground: bool
    hd95_mm: float = float("nan")  # NaN without a spacing


def has_cases(ids: Sequence[str]) -> bool:
    """Whether any id names a case (:func:`fedsm_core.data.cases.named_case`)."""
    return any(named_case(example) is not None for example in ids)


def group_cases(ids: Sequence[str]) -> dict[str, list[int]]:
    """Case -> indices of its slices in ``ids``, in slice order; images without a case are left out."""
    cases: dict[str, list[int]] = {}
    for index, example in enumerate(ids):
        case = named_case(example)
        if case is not None:
            cases.setdefault(case, []).append(index)
    return {case: sorted(rows, key=lambda row: (slice_number(ids[row]) or 0, ids[row])) for case, rows in cases.items()}


def slice_positions(ids: Sequence[str]) -> np.ndarray:
    """Positions ``[S]`` along the volume's first axis of one case's slices (first is 0).

    Their slice numbers minus the lowest, or ``0, 1, ...`` in the given order
    when a slice has no number or two share one.
    """
    numbers = [slice_number(example) for example in ids]
    if any(n is None for n in numbers) or len(set(numbers)) != len(numbers):
        return np.arange(len(ids))
    values = np.asarray(numbers, dtype=np.int64)
    return values - values.min()


def stack_case(masks: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The volume ``[C, Z, H, W]`` (bool): slice masks ``[S, C, H, W]`` placed at ``positions``, empty elsewhere."""
    volume = np.zeros((int(positions.max()) + 1, *masks.shape[1:]), dtype=bool)
    volume[positions] = masks.astype(bool)
    return np.moveaxis(volume, 0, 1)


def dice_3d(pred: np.ndarray, target: np.ndarray) -> float:
    """Mean over structures of the Dice of volumes ``[C, Z, H, W]`` (1 for a structure empty in both)."""
    return float(dice_per_structure(torch.from_numpy(pred[None]), torch.from_numpy(target[None])).mean())


def surface(mask: np.ndarray) -> np.ndarray:
    """The mask's voxels with a 6-connected (face) neighbour outside it or outside the array."""
    structure = ndimage.generate_binary_structure(mask.ndim, 1)
    return mask & ~ndimage.binary_erosion(mask, structure=structure, border_value=0)


def hd95(pred: np.ndarray, target: np.ndarray, spacing: Sequence[float] | None = None) -> float:
    """Symmetric 95th-percentile Hausdorff distance between two binary masks' surfaces (NaN if one is empty).

    Parameters
    ----------
    pred, target : np.ndarray
        bool masks of one structure, same shape (``[Z, H, W]`` for a volume).
    spacing : sequence of float, optional
        Voxel size along each axis (e.g. millimetres, ``(dz, dy, dx)``); voxels when omitted.
    """
    if pred.shape != target.shape:
        raise ValueError(f"hd95: prediction shape {pred.shape} != target shape {target.shape}")
    if spacing is not None and len(spacing) != pred.ndim:
        raise ValueError(f"hd95: spacing {tuple(spacing)} has {len(spacing)} values for {pred.ndim}-D masks; "
                         "give one voxel size per axis")
    pred, target = pred.astype(bool), target.astype(bool)
    if not pred.any() or not target.any():
        return float("nan")
    # Only the box around both masks matters (one voxel more, so the surfaces are the same).
    box = tuple(slice(max(int(i.min()) - 1, 0), int(i.max()) + 2) for i in np.nonzero(pred | target))
    pred_surface, target_surface = surface(pred[box]), surface(target[box])
    to_target = ndimage.distance_transform_edt(~target_surface, sampling=spacing)[pred_surface]
    to_pred = ndimage.distance_transform_edt(~pred_surface, sampling=spacing)[target_surface]
    return float(max(np.percentile(to_target, 95), np.percentile(to_pred, 95)))


def volume_hd95(pred: np.ndarray, target: np.ndarray, spacing: Sequence[float] | None = None) -> float:
    """Mean over structures of :func:`hd95` of volumes ``[C, Z, H, W]``, where defined (NaN where none is)."""
    values = [hd95(p, t, spacing) for p, t in zip(pred, target, strict=True)]
    defined = [v for v in values if not np.isnan(v)]
    return float(np.mean(defined)) if defined else float("nan")


def score_cases(pred: np.ndarray, target: np.ndarray, ids: Sequence[str],
                spacings: Mapping[str, Sequence[float]] | None = None) -> list[CaseScore]:
    """3-D Dice and HD95 of every case of a split (empty when no id names a case).

    Parameters
    ----------
    pred, target : np.ndarray
        Binary slice masks ``[N, C, H, W]`` (prediction and target), in the order of ``ids``.
    ids : sequence of str
        The split's example ids.
    spacings : mapping of str to sequence of float, optional
        Case -> ``(dz, dy, dx)`` in mm of its stacked volume; a case in it also
        gets its HD95 in mm (``hd95_mm``).
    """
    if pred.shape != target.shape or len(ids) != len(pred):
        raise ValueError(f"score_cases: prediction {pred.shape}, target {target.shape} and {len(ids)} ids "
                         "must describe the same slices")
    scores = []
    for case, rows in group_cases(ids).items():
        positions = slice_positions([ids[row] for row in rows])
        p, t = stack_case(pred[rows], positions), stack_case(target[rows], positions)
        spacing = (spacings or {}).get(case)
        millimetres = volume_hd95(p, t, spacing) if spacing is not None else float("nan")
        scores.append(CaseScore(case, dice_3d(p, t), volume_hd95(p, t), bool(t.any()), millimetres))
    return scores


def summarize_cases(scores: Sequence[CaseScore], model: str, in_mm: bool = False) -> dict[str, float]:
    """``case-dice-<model>``, ``case-hd95-<model>`` and ``num-missed-cases-<model>`` of one model's case scores.

    With ``in_mm`` (every case has a spacing) also ``case-hd95-mm-<model>``, over the same cases.
    """
    kept = [s for s in scores if s.foreground]
    located = [s for s in kept if not np.isnan(s.hd95)]
    summary = {CASE_DICE + model: float(np.mean([s.dice for s in kept])) if kept else float("nan"),
               CASE_HD95 + model: float(np.mean([s.hd95 for s in located])) if located else float("nan"),
               NUM_MISSED + model: float(len(kept) - len(located))}
    if in_mm:
        summary[CASE_HD95_MM + model] = float(np.mean([s.hd95_mm for s in located])) if located else float("nan")
    return summary


def case_metrics(predictions: Mapping[str, np.ndarray], target: np.ndarray, ids: Sequence[str],
                 spacings: Mapping[str, Sequence[float]] | None = None) -> dict[str, float]:
    """Per-case metrics of several models on one split; ``{}`` when no id names a case.

    Parameters
    ----------
    predictions : mapping of str to np.ndarray
        Model name (``global``, ``super``, ...) -> its binary slice masks ``[N, C, H, W]``.
    target : np.ndarray
        Target slice masks ``[N, C, H, W]`` (values 0/1).
    spacings : mapping of str to sequence of float, optional
        Case -> ``(dz, dy, dx)`` in mm; HD95 is also reported in mm when every case has one.
    """
    if not has_cases(ids):
        return {}
    in_mm = bool(spacings) and all(case in spacings for case in group_cases(ids))
    metrics: dict[str, float] = {}
    for model, pred in predictions.items():
        scores = score_cases(pred, target > 0.5, ids, spacings if in_mm else None)
        metrics.update(summarize_cases(scores, model, in_mm))
        metrics[NUM_CASES] = float(len(scores))
        metrics[NUM_EMPTY_CASES] = float(sum(not s.foreground for s in scores))
    return metrics


class CaseMasks:
    """Collects models' predicted slice masks batch by batch, only when the split's ids name cases."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.ids = tuple(ids)
        self.active = has_cases(self.ids)
        self._parts: dict[str, list[np.ndarray]] = {}

    def add(self, model: str, predicted: torch.Tensor) -> None:
        """Append a batch of ``model``'s binary masks ``[B, C, H, W]`` (nothing when inactive)."""
        if self.active:
            self._parts.setdefault(model, []).append(predicted.bool().cpu().numpy())

    def result(self, target: np.ndarray, models: Sequence[str] | None = None,
               spacings: Mapping[str, Sequence[float]] | None = None) -> dict[str, float]:
        """:func:`case_metrics` of the collected models (or of ``models`` among them) against ``target``."""
        if not self.active or not self._parts:
            return {}
        chosen = [m for m in self._parts if models is None or m in models]
        return case_metrics({m: np.concatenate(self._parts[m]) for m in chosen}, target, self.ids, spacings)
