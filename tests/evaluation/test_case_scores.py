"""Per-case 3-D Dice and HD95 against hand-made volumes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsm_core.evaluation.case_scores import (
    CaseMasks,
    case_metrics,
    dice_3d,
    group_cases,
    hd95,
    score_cases,
    slice_positions,
    surface,
)


def _cube(shape: tuple[int, ...], corner: tuple[int, ...], side: int) -> np.ndarray:
    """bool array of ``shape`` with a cube of ``side`` voxels from ``corner``."""
    mask = np.zeros(shape, dtype=bool)
    mask[tuple(slice(c, c + side) for c in corner)] = True
    return mask


def test_the_surface_of_a_cube_is_the_cube_without_its_inside():
    # 4^3 = 64 voxels, of which the 2^3 = 8 inner ones have all six neighbours inside
    assert surface(_cube((6, 6, 6), (1, 1, 1), 4)).sum() == 64 - 8
    # a mask touching the array's border: the border counts as outside, so every voxel of a 2-thick slab is surface
    assert surface(np.ones((2, 5, 5), dtype=bool)).sum() == 50


def test_two_cubes_offset_by_one_voxel():
    # Prepare: 2x2x2 cubes (every voxel on the surface), the prediction one voxel further along x
    target = _cube((6, 6, 6), (2, 2, 2), 2)
    pred = _cube((6, 6, 6), (2, 2, 3), 2)

    # Execute / Assert: 4 shared voxels, Dice = 2 * 4 / (8 + 8) = 0.5.
    # Distances either way: 4 voxels at 0, 4 at 1 voxel; 95th percentile of [0,0,0,0,1,1,1,1] = 1
    assert dice_3d(pred[None], target[None]) == 0.5
    assert hd95(pred, target) == 1.0
    # with (dz, dy, dx) = (3, 1, 0.5) mm the shift along x is 0.5 mm
    assert hd95(pred, target, spacing=(3.0, 1.0, 0.5)) == 0.5


def test_a_diagonal_offset_with_anisotropic_spacing():
    # Prepare: 2x2x2 cubes, the prediction one voxel further along z and along y
    target = _cube((6, 6, 6), (1, 1, 1), 2)
    pred = _cube((6, 6, 6), (2, 2, 1), 2)

    # Execute / Assert: shared voxels z = y = 2, x = 1..2: 2; Dice = 2 * 2 / 16 = 0.25.
    # A prediction voxel at (z, y) offsets (0, 0), (0, 1), (1, 0), (1, 1) from the shared row, two of each
    # (x): nearest target voxel at 0, dy, dz, sqrt(dz^2 + dy^2). In voxels [0,0,1,1,1,1,r2,r2] -> p95 = sqrt(2);
    # with dz = 3 mm, dy = dx = 1 mm: [0,0,1,1,3,3,r10,r10] -> p95 = sqrt(10) (the same both ways, by symmetry).
    assert dice_3d(pred[None], target[None]) == 0.25
    assert hd95(pred, target) == pytest.approx(math.sqrt(2.0), abs=1e-12)
    assert hd95(pred, target, spacing=(3.0, 1.0, 1.0)) == pytest.approx(math.sqrt(10.0), abs=1e-12)


def test_hd95_is_the_larger_directed_95th_percentile_not_the_maximum():
    # Prepare: the prediction is the target cube plus one voxel 10 voxels away along x
    target = _cube((4, 4, 16), (1, 1, 1), 2)
    pred = target.copy()
    pred[1, 1, 12] = True

    # Execute / Assert: prediction -> target: eight 0s and one 10, p95 at rank 0.95 * 8 = 7.6 -> 0 + 0.6 * 10 = 6;
    # target -> prediction: all 0. HD95 = max(6, 0) = 6 (the Hausdorff distance would be 10).
    assert hd95(pred, target) == pytest.approx(6.0, abs=1e-12)
    assert dice_3d(pred[None], target[None]) == pytest.approx(2 * 8 / 17)


def test_an_empty_side_has_no_hd95_and_two_empty_volumes_score_dice_one():
    empty, cube = np.zeros((4, 4, 4), dtype=bool), _cube((4, 4, 4), (1, 1, 1), 2)
    assert math.isnan(hd95(empty, cube)) and math.isnan(hd95(cube, empty))
    assert dice_3d(empty[None], empty[None]) == 1.0
    assert dice_3d(empty[None], cube[None]) == 0.0


def test_bad_shapes_and_spacings_are_refused_with_the_values():
    cube = _cube((4, 4, 4), (1, 1, 1), 2)
    with pytest.raises(ValueError, match=r"prediction shape \(4, 4, 4\) != target shape \(4, 4\)"):
        hd95(cube, cube[0])
    with pytest.raises(ValueError, match=r"spacing \(1.0, 1.0\) has 2 values for 3-D masks"):
        hd95(cube, cube, spacing=(1.0, 1.0))


def test_cases_come_from_the_ids_in_slice_order():
    ids = ["BIDMC/Case07/z011", "BIDMC/Case07/z010", "site-1/00/00_02", "site-3/0007", "site-1/00/00_01"]
    assert group_cases(ids) == {"BIDMC/Case07": [1, 0], "site-1/00": [4, 2]}
    assert slice_positions(["a/c/z010", "a/c/z011", "a/c/z013"]).tolist() == [0, 1, 3]
    assert slice_positions(["a/c/top", "a/c/bottom"]).tolist() == [0, 1]  # no numbers: in the given order


def _slices(ids: list[str], squares: dict[str, tuple[int, int]]) -> np.ndarray:
    """[N, 1, 6, 6] masks: a 2x2 square at ``squares[id]`` (row, column) on the listed slices, else empty."""
    masks = np.zeros((len(ids), 1, 6, 6), dtype=bool)
    for index, example in enumerate(ids):
        if example in squares:
            row, column = squares[example]
            masks[index, 0, row:row + 2, column:column + 2] = True
    return masks


def test_a_case_volume_keeps_the_gaps_between_its_slices():
    # Prepare: slices 10, 11 and 13 of one case (12 was not evaluated); the target has a 2x2 square on
    # 10 and 11, the prediction too plus the same square on slice 13
    ids = ["s/c/z010", "s/c/z011", "s/c/z013"]
    target = _slices(ids, {"s/c/z010": (2, 2), "s/c/z011": (2, 2)})
    pred = _slices(ids, {example: (2, 2) for example in ids})

    # Execute
    (voxels,) = score_cases(pred, target, ids)
    (millimetres,) = score_cases(pred, target, ids, spacings={"s/c": (3.0, 1.0, 1.0)})

    # Assert: |P| = 12, |T| = 8, |P & T| = 8 -> Dice = 16 / 20 = 0.8. Prediction -> target: eight 0s and
    # four 2s (slice 13 is two slice steps from slice 11), p95 at rank 0.95 * 11 = 10.45 -> 2; target ->
    # prediction all 0: HD95 = 2 voxels, 6 mm with 3 mm slices (stacked without the gap it would be 1)
    assert voxels.case == "s/c" and voxels.foreground
    assert voxels.dice == pytest.approx(0.8)
    assert voxels.hd95 == pytest.approx(2.0) and np.isnan(voxels.hd95_mm)
    assert millimetres.hd95 == pytest.approx(2.0) and millimetres.hd95_mm == pytest.approx(6.0)


def test_case_metrics_leave_empty_and_missed_cases_out_of_their_means():
    # Prepare: case a found exactly; case b missed (nothing predicted); case e with an empty target,
    # where the model predicts something; one image without a case
    ids = ["s/a/z000", "s/a/z001", "s/b/z000", "s/e/z000", "s/0007"]
    target = _slices(ids, {"s/a/z000": (1, 1), "s/a/z001": (1, 1), "s/b/z000": (3, 3), "s/0007": (0, 0)})
    pred = _slices(ids, {"s/a/z000": (1, 1), "s/a/z001": (1, 1), "s/e/z000": (0, 0)})

    # Execute
    metrics = case_metrics({"global": pred}, target.astype(np.float32), ids)

    # Assert: Dice over a (1) and b (0) = 0.5; HD95 over a only = 0; b counted as missed; e as empty
    assert metrics == {"case-dice-global": 0.5, "case-hd95-global": 0.0, "num-missed-cases-global": 1.0,
                       "num-cases": 3.0, "num-empty-cases": 1.0}


def test_hd95_in_mm_is_reported_with_a_spacing_for_every_case_and_only_then():
    # Prepare: case a predicted one slice step too far (slice 2 holds a square only in the prediction),
    # case b exactly; case a has 2.5 mm slices, b 4 mm; a third case c without a spacing in the second call
    ids = ["s/a/z000", "s/a/z001", "s/a/z002", "s/b/z000"]
    target = _slices(ids, {"s/a/z000": (1, 1), "s/a/z001": (1, 1), "s/b/z000": (3, 3)})
    pred = _slices(ids, {"s/a/z000": (1, 1), "s/a/z001": (1, 1), "s/a/z002": (1, 1), "s/b/z000": (3, 3)})
    spacings = {"s/a": (2.5, 0.5, 0.5), "s/b": (4.0, 1.0, 1.0)}

    # Execute
    both = case_metrics({"super": pred}, target.astype(np.float32), ids, spacings)
    partial = case_metrics({"super": pred}, target.astype(np.float32), ids, {"s/a": (2.5, 0.5, 0.5)})

    # Assert: case a: prediction -> target distances 0 (x8) and 1 slice step (x4), p95 at rank 0.95 * 11 =
    # 10.45 -> 1 step = 1 voxel = 2.5 mm; b: 0. Means over a and b: 0.5 voxels, 1.25 mm
    assert both["case-hd95-super"] == pytest.approx(0.5)
    assert both["case-hd95-mm-super"] == pytest.approx(1.25)
    assert "case-hd95-mm-super" not in partial and partial["case-hd95-super"] == pytest.approx(0.5)


def test_images_without_cases_have_no_case_metrics():
    ids = ["site-3/0007", "site-3/0008"]
    masks = np.ones((2, 2, 4, 4), dtype=bool)
    collected = CaseMasks(ids)
    collected.add("global", torch.ones(2, 2, 4, 4))
    assert case_metrics({"global": masks}, masks, ids) == {}
    assert not collected.active and collected.result(masks) == {}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hd95_equals_brute_force_over_every_pair_of_surface_voxels(seed):
    # Prepare: random blobs in a 7x9x8 volume, anisotropic voxels
    rng = np.random.default_rng(seed)
    pred, target = rng.random((7, 9, 8)) > 0.6, rng.random((7, 9, 8)) > 0.6
    spacing = np.array([2.5, 0.7, 1.1])

    # Execute: every surface voxel's distance to every surface voxel of the other mask, nearest kept
    a, b = np.argwhere(surface(pred)) * spacing, np.argwhere(surface(target)) * spacing
    pairwise = np.linalg.norm(a[:, None, :] - b[None, :, :], axis=2)
    expected = max(np.percentile(pairwise.min(axis=1), 95), np.percentile(pairwise.min(axis=0), 95))

    # Assert
    assert hd95(pred, target, spacing=tuple(spacing)) == pytest.approx(expected, abs=1e-9)
