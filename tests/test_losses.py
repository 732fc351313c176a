"""Tests of the soft Dice loss."""

from __future__ import annotations

import re

import pytest
import torch

from fedsm_core.losses import soft_dice_loss, soft_dice_loss_per_image


def _half_mask(size: int = 16) -> torch.Tensor:
    target = torch.zeros(1, 1, size, size, dtype=torch.float64)
    target[..., : size // 2, :] = 1.0
    return target


def test_perfect_confident_prediction_is_near_zero():
    # Prepare
    target = _half_mask()
    logits = (target * 2.0 - 1.0) * 30.0  # +30 on foreground, -30 on background

    # Execute
    loss = soft_dice_loss(logits, target)

    # Assert
    assert loss.ndim == 0
    assert 0.0 <= loss.item() < 1e-6


def test_opposite_confident_prediction_is_near_one():
    # Prepare
    # 128 foreground pixels, prediction is 1 exactly on the 128 background ones:
    #   L = 1 - (2 * 0 + 1) / (128 + 128 + 1) = 1 - 1/257 ~ 0.9961
    target = _half_mask()
    logits = (1.0 - 2.0 * target) * 30.0

    # Execute
    loss = soft_dice_loss(logits, target)

    # Assert
    assert loss.item() == pytest.approx(1.0 - 1.0 / 257.0, abs=1e-9)


def test_hand_computed_uncertain_prediction():
    # Prepare
    # logits 0 -> p = 0.5 everywhere on a 2x2 image with one foreground pixel:
    #   sum(p * y) = 0.5, sum(p) = 2, sum(y) = 1
    #   L = 1 - (2 * 0.5 + 1) / (2 + 1 + 1) = 1 - 2/4 = 0.5
    target = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]]], dtype=torch.float64)
    logits = torch.zeros_like(target)

    # Execute
    loss = soft_dice_loss(logits, target)

    # Assert
    assert loss.item() == pytest.approx(0.5, abs=1e-15)


def test_mean_over_images_and_structures():
    # Prepare
    # channel 0 as above (0.5); channel 1: empty target, p = 0.5 on 4 pixels:
    #   L = 1 - (0 + 1) / (2 + 0 + 1) = 2/3;   mean = (0.5 + 2/3) / 2 = 7/12
    target = torch.zeros(1, 2, 2, 2, dtype=torch.float64)
    target[0, 0, 0, 0] = 1.0
    logits = torch.zeros_like(target)

    # Execute
    loss = soft_dice_loss(logits, target)
    per_image = soft_dice_loss_per_image(torch.cat([logits, logits]), torch.cat([target, target]))

    # Assert
    assert loss.item() == pytest.approx(7.0 / 12.0, abs=1e-15)
    assert per_image.shape == (2,)
    torch.testing.assert_close(per_image, torch.full((2,), 7.0 / 12.0, dtype=torch.float64))


def test_loss_has_gradients():
    # Prepare
    target = _half_mask(4)
    logits = torch.zeros_like(target, requires_grad=True)

    # Execute
    soft_dice_loss(logits, target).backward()

    # Assert
    assert logits.grad is not None
    # raising a foreground logit lowers the loss, raising a background logit raises it
    assert (logits.grad[target.bool()] < 0).all()
    assert (logits.grad[~target.bool()] > 0).all()


def test_shape_mismatch_names_both_shapes():
    # Prepare
    logits = torch.zeros(2, 3, 4, 4)
    target = torch.zeros(2, 2, 4, 4)

    # Execute / Assert
    with pytest.raises(ValueError, match=re.escape("(2, 3, 4, 4)") + ".*" + re.escape("(2, 2, 4, 4)")):
        soft_dice_loss(logits, target)
