"""Tests of the hard Dice metrics."""

from __future__ import annotations

import re

import pytest
import torch

from fedsm_core.metrics import dice_per_image, dice_per_structure


def _mask(rows) -> torch.Tensor:
    """A [1, 1, H, W] mask from nested lists."""
    return torch.tensor(rows, dtype=torch.float32)[None, None]


def test_both_empty_masks_score_one():
    # Prepare
    empty = _mask([[0, 0], [0, 0]])

    # Execute
    dice = dice_per_structure(empty, empty)

    # Assert
    assert dice.dtype == torch.float64
    assert dice.shape == (1, 1)
    assert dice.item() == 1.0


def test_disjoint_masks_score_zero():
    # Prepare
    pred = _mask([[1, 0], [0, 0]])
    target = _mask([[0, 0], [0, 1]])

    # Execute
    dice = dice_per_structure(pred, target)

    # Assert
    assert dice.item() == 0.0


def test_one_empty_one_full_scores_zero():
    # Prepare
    pred = _mask([[0, 0], [0, 0]])
    target = _mask([[1, 1], [1, 1]])

    # Execute / Assert
    assert dice_per_structure(pred, target).item() == 0.0


def test_partial_overlap_2x2():
    # Prepare
    # |P| = 2, |Y| = 1, |P & Y| = 1  ->  Dice = 2 * 1 / (2 + 1) = 2/3
    pred = _mask([[1, 1], [0, 0]])
    target = _mask([[1, 0], [0, 0]])

    # Execute
    dice = dice_per_structure(pred, target)

    # Assert
    assert dice.item() == pytest.approx(2.0 / 3.0, abs=1e-15)


def test_partial_overlap_3x3():
    # Prepare
    # |P| = 4, |Y| = 3, |P & Y| = 2  ->  Dice = 2 * 2 / (4 + 3) = 4/7
    pred = _mask([[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    target = _mask([[0, 1, 0], [0, 1, 1], [0, 0, 0]])

    # Execute
    dice = dice_per_structure(pred, target)

    # Assert
    assert dice.item() == pytest.approx(4.0 / 7.0, abs=1e-15)


def test_bool_and_float_masks_agree():
    # Prepare
    pred = _mask([[1, 1], [0, 1]])
    target = _mask([[1, 0], [0, 1]])

    # Execute
    from_float = dice_per_structure(pred, target)
    from_bool = dice_per_structure(pred.bool(), target.bool())

    # Assert
    # |P| = 3, |Y| = 2, |P & Y| = 2  ->  4/5
    assert from_float.item() == pytest.approx(0.8, abs=1e-15)
    assert torch.equal(from_float, from_bool)


def test_per_structure_and_per_image_shapes():
    # Prepare
    # image 0: structure 0 perfect (1), structure 1 disjoint (0)      -> mean 0.5
    # image 1: structure 0 both empty (1), structure 1 2*1/(2+1)=2/3  -> mean 5/6
    target = torch.tensor(
        [
            [[[1, 0], [0, 0]], [[0, 1], [0, 0]]],
            [[[0, 0], [0, 0]], [[1, 0], [0, 0]]],
        ],
        dtype=torch.float32,
    )
    pred = torch.tensor(
        [
            [[[1, 0], [0, 0]], [[0, 0], [1, 0]]],
            [[[0, 0], [0, 0]], [[1, 1], [0, 0]]],
        ],
        dtype=torch.float32,
    )
    logits = torch.where(pred > 0, torch.tensor(10.0), torch.tensor(-10.0))

    # Execute
    per_structure = dice_per_structure(pred, target)
    per_image = dice_per_image(logits, target)

    # Assert
    torch.testing.assert_close(per_structure, torch.tensor([[1.0, 0.0], [1.0, 2.0 / 3.0]], dtype=torch.float64))
    torch.testing.assert_close(per_image, torch.tensor([0.5, 5.0 / 6.0], dtype=torch.float64))


def test_dice_per_image_threshold_is_strict():
    # Prepare
    # logit 0 -> sigmoid 0.5, which is not > 0.5, so the prediction is empty
    logits = torch.zeros(1, 1, 2, 2)
    target = _mask([[1, 0], [0, 0]])

    # Execute / Assert
    assert dice_per_image(logits, target).item() == 0.0
    assert dice_per_image(logits, target, threshold=0.4).item() == pytest.approx(2.0 / 5.0)


def test_shape_mismatch_names_both_shapes():
    # Prepare
    pred = torch.zeros(1, 2, 3, 3)
    target = torch.zeros(1, 1, 3, 3)

    # Execute / Assert
    with pytest.raises(ValueError, match=re.escape("(1, 2, 3, 3)") + ".*" + re.escape("(1, 1, 3, 3)")):
        dice_per_structure(pred, target)
