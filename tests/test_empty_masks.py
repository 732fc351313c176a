"""Images without foreground are reported apart: their count and false-positive rate, not Dice 1.0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.super_model_evaluation import evaluate_model
from fedsm_core.metrics import split_scores
from fedsm_core.run_files.run_outputs import format_table, pool_site_metrics


class Constant(torch.nn.Module):
    """Predicts the same logit everywhere: -10 (nothing) or +10 (everything)."""

    def __init__(self, logit: float) -> None:
        super().__init__()
        self.logit = logit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full((x.shape[0], 1, *x.shape[2:]), self.logit)


def arrays(foreground: list[bool]) -> SegArrays:
    masks = np.zeros((len(foreground), 1, 4, 4), np.float32)
    for i, has in enumerate(foreground):
        if has:
            masks[i, 0, :2, :2] = 1.0   # 4 of 16 pixels
    return SegArrays(np.zeros((len(foreground), 3, 4, 4), np.float32), masks, tuple(map(str, range(len(foreground)))))


def test_split_scores_takes_dice_over_images_with_foreground_only():
    # Dice of images 0 and 3 (with foreground): (0.5 + 0.8) / 2 = 0.65; empty images 1, 2: one predicted -> 0.5
    scores = split_scores(torch.tensor([0.5, 1.0, 1.0, 0.8]), torch.tensor([True, False, True, True]),
                          torch.tensor([True, False, False, True]))

    assert scores == pytest.approx({"dice-global": 0.65, "num-empty": 2.0, "empty-fp-global": 0.5})


def test_a_model_that_predicts_nothing_gets_no_credit_for_empty_images():
    # Prepare: two images with foreground, one without
    data = arrays([True, False, True])

    # Execute
    nothing = evaluate_model(Constant(-10.0), data)
    everything = evaluate_model(Constant(10.0), data)

    # Assert: predicting nothing misses both structures (Dice 0; the empty image's 1.0 is not averaged in)
    assert nothing == {"dice-global": 0.0, "num-images": 3.0, "num-empty": 1.0, "empty-fp-global": 0.0}
    # predicting everything: Dice 2*4/(16+4) = 0.4 on each image with foreground; the empty image is a false positive
    assert everything == pytest.approx({"dice-global": 0.4, "num-images": 3.0, "num-empty": 1.0,
                                        "empty-fp-global": 1.0})


def test_a_site_of_only_empty_images_has_no_dice_and_pooling_skips_it():
    only_empty = evaluate_model(Constant(-10.0), arrays([False, False]))

    assert np.isnan(only_empty["dice-global"]) and only_empty["num-empty"] == 2.0


def test_pooling_weights_dice_by_images_with_foreground_and_fp_by_empty_images():
    per_site = {
        "a": {"dice-global": 0.5, "num-images": 4.0, "num-empty": 2.0, "empty-fp-global": 0.5},
        "b": {"dice-global": 0.8, "num-images": 4.0, "num-empty": 0.0},
        "c": {"dice-global": float("nan"), "num-images": 1.0, "num-empty": 1.0, "empty-fp-global": 1.0},
    }

    pooled = pool_site_metrics(per_site)

    # Dice: (0.5 * 2 + 0.8 * 4) / 6 = 0.7; false positives: (0.5 * 2 + 1.0 * 1) / 3 = 2/3; counts add up
    assert pooled == pytest.approx({"dice-global": 0.7, "empty-fp-global": 2 / 3, "num-empty": 3.0,
                                    "num-images": 9.0})


def test_the_summary_table_shows_the_empty_images_apart():
    lines = format_table({"a": {"dice-global": 0.5, "num-images": 4.0, "num-empty": 2.0, "empty-fp-global": 0.5}})

    assert lines[0] == "| site | images | dice-global | num-empty | empty-fp-global |"
    assert lines[2] == "| a | 4 | 0.5000 | 2 | 0.5000 |"
