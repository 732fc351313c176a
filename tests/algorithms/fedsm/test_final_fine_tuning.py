"""Final fine-tuning: the global model adapted to a site, the pass chosen on the site's validation split."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsm_core.algorithms.fedsm.final_fine_tuning import fine_tune_on_splits, fine_tune_on_validation
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.super_model_evaluation import evaluate_model
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights

SPEC = ModelSpec("mobilenet_v2", num_structures=2, num_sites=2, selector_width=4)


def _site(count: int, seed: int) -> SegArrays:
    """Images whose masks are a threshold of their first two channels: a rule a U-Net learns in a few passes."""
    rng = np.random.default_rng(seed)
    images = rng.random((count, 3, 32, 32), dtype=np.float32)
    masks = (images[:, :2] > 0.5).astype(np.float32)
    return SegArrays(images, masks, tuple(f"site/{seed}-{i}" for i in range(count)))


def _global_weights():
    torch.manual_seed(0)
    return get_weights(SPEC.build_segmentation())


def _settings(lr: float) -> RoundSettings:
    return RoundSettings(batch_size=4, local_epochs=1, max_local_steps=0, lr=lr, selector_lr=1e-3, seed=3)


def test_fine_tuning_keeps_the_pass_best_on_validation_and_that_model_scores_it():
    # Execute
    tuned = fine_tune_on_validation(SPEC, _global_weights(), _site(8, 1), _site(4, 2), 4, _settings(1e-2))

    # Assert: it learned (the rule is learnable), the kept pass is the first best on validation, and the kept
    # weights are the model that scored it
    assert len(tuned.curve) == 5
    assert tuned.passes == int(np.argmax(tuned.curve)) and tuned.passes > 0
    assert tuned.validation_dice > tuned.curve[0] + 0.05, tuned.curve
    kept = SPEC.load_segmentation(tuned.weights)
    assert evaluate_model(kept, _site(4, 2), 8)["dice-global"] == pytest.approx(tuned.validation_dice, abs=1e-6)


def test_choosing_on_several_splits_keeps_what_one_run_per_split_keeps_bit_for_bit():
    # Arrange: two choosers that disagree (different images), each also fine-tuned on its own
    train, first, second = _site(8, 1), _site(4, 2), _site(4, 5)
    alone = [fine_tune_on_validation(SPEC, _global_weights(), train, split, 4, _settings(1e-2))
             for split in (first, second)]

    # Execute
    together = fine_tune_on_splits(SPEC, _global_weights(), train, [first, second], 4, _settings(1e-2))

    # Assert: the same passes, curves and kept weights: one training run serves every split
    for one, other in zip(alone, together, strict=True):
        assert other.passes == one.passes and other.curve == one.curve
        assert all(np.array_equal(other.weights[key], one.weights[key]) for key in one.weights)
    assert alone[0].curve != alone[1].curve


def test_fine_tuning_refuses_an_empty_chooser_or_no_passes():
    with pytest.raises(ValueError, match="validation split, which is empty"):
        fine_tune_on_splits(SPEC, _global_weights(), _site(8, 1), [_site(4, 2), _site(0, 3)], 1, _settings(1e-2))
    with pytest.raises(ValueError, match="max_passes = 0"):
        fine_tune_on_splits(SPEC, _global_weights(), _site(8, 1), [_site(4, 2)], 0, _settings(1e-2))


def test_a_tie_keeps_the_earlier_pass_so_an_unmoved_model_is_the_global_model_itself():
    # Arrange: lr 0 moves nothing (GroupNorm keeps no running statistics), so every pass ties with pass 0
    start = _global_weights()

    # Execute
    tuned = fine_tune_on_validation(SPEC, start, _site(8, 1), _site(4, 2), 2, _settings(0.0))

    # Assert
    assert tuned.curve[0] == tuned.curve[1] == tuned.curve[2]
    assert tuned.passes == 0
    assert all(np.array_equal(tuned.weights[key], start[key]) for key in start)


def test_the_same_seed_fine_tunes_to_the_same_model():
    first = fine_tune_on_validation(SPEC, _global_weights(), _site(4, 1), _site(2, 2), 1, _settings(1e-2))
    second = fine_tune_on_validation(SPEC, _global_weights(), _site(4, 1), _site(2, 2), 1, _settings(1e-2))
    assert first.curve == second.curve and first.passes == second.passes
    assert all(np.array_equal(first.weights[key], second.weights[key]) for key in first.weights)


@pytest.mark.parametrize(("passes", "val", "message"), [
    (0, _site(2, 2), "at least one pass"),
    (2, SegArrays(np.zeros((0, 3, 32, 32), np.float32), np.zeros((0, 2, 32, 32), np.float32), ()), "empty"),
])
def test_no_passes_or_no_validation_images_is_refused(passes, val, message):
    with pytest.raises(ValueError, match=message):
        fine_tune_on_validation(SPEC, _global_weights(), _site(4, 1), val, passes, _settings(1e-2))
