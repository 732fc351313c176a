"""A single model's local training: Adam's state fresh every round (reset) or kept at the site (local)."""

from __future__ import annotations

import numpy as np
import torch

from fedsm_core.algorithms.baselines.global_client import GlobalClientOptions, train_global_client
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SegArrays
from fedsm_core.losses import soft_dice_loss
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights, set_weights
from fedsm_core.training.local_update import Learner, train_on_split
from fedsm_core.training.optimizer_state import new_adam

SPEC = ModelSpec("mobilenet_v2", num_structures=1, num_sites=2, selector_width=4)


def _data() -> SegArrays:
    rng = np.random.default_rng(0)
    return SegArrays(rng.random((6, 3, 32, 32), dtype=np.float32),
                     (rng.random((6, 1, 32, 32)) > 0.5).astype(np.float32), tuple(f"x/{i}" for i in range(6)))


def _round(weights, seed: int, kept):
    settings = RoundSettings(batch_size=3, local_epochs=1, max_local_steps=0, lr=1e-3, selector_lr=1e-3, seed=seed,
                             precision="fp32")
    return train_global_client(weights, _data(), SPEC, settings, GlobalClientOptions(optimizer_state=kept),
                               torch.device("cpu"))


def test_kept_adam_state_continues_into_the_next_round_and_reset_starts_afresh():
    # Prepare
    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = get_weights(SPEC.build_segmentation())

    # Execute: round 1 reset and local (its first round starts fresh too), round 2 of each
    reset_1, _ = _round(start, 1, None)
    local_1, metrics = _round(start, 1, {})
    reset_2, _ = _round(reset_1.weights, 2, None)
    local_2, _ = _round(local_1.weights, 2, local_1.optimizer_state)

    # Assert: round 1 is bit for bit the same; the kept state counts both rounds' steps; round 2 then differs
    assert reset_1.optimizer_state is None and metrics["steps"] == 2
    for key, value in reset_1.weights.items():
        np.testing.assert_array_equal(local_1.weights[key], value, err_msg=key)
    steps = {key: float(v) for key, v in local_2.optimizer_state.items() if key.endswith("/step")}
    assert set(steps.values()) == {4.0}  # 2 steps in each round, counted on from round 1
    assert any(not np.array_equal(local_2.weights[k], v) for k, v in reset_2.weights.items())


def test_two_rounds_with_kept_state_equal_one_adam_over_both_rounds():
    # Prepare
    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = get_weights(SPEC.build_segmentation())
    model = SPEC.build_segmentation()
    set_weights(model, start, "start")
    learner = Learner("global", model, new_adam(model.parameters(), 1e-3), soft_dice_loss)

    # Execute: two rounds through the client, and one optimizer that is never re-created over the same batches
    first, _ = _round(start, 1, {})
    second, _ = _round(first.weights, 2, first.optimizer_state)
    for seed in (1, 2):
        train_on_split([learner], _data(), 3, 1, 0, seed, "cpu", "flip", "fp32")

    # Assert
    for key, value in get_weights(model).items():
        np.testing.assert_array_equal(second.weights[key], value, err_msg=key)


def test_local_steps_gives_every_site_the_same_number_of_steps_and_min_local_steps_stretches_only_short_rounds():
    # Prepare: 6 images in batches of 3 are 2 steps a pass; 2 images are 1
    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = get_weights(SPEC.build_segmentation())
    big = _data()
    small = SegArrays(big.images[:2], big.masks[:2], big.ids[:2])
    configs = {"fixed": {"local-steps": 5}, "epochs": {}, "minimum": {"min-local-steps": 2},
               "minimum-5": {"min-local-steps": 5}}

    # Execute
    steps, weights = {}, {}
    for name, values in configs.items():
        config = RunConfig.from_mapping({**values, "batch-size": 3})
        for size, data in (("big", big), ("small", small)):
            update, metrics = train_global_client(start, data, SPEC, config.round_settings(1, 0),
                                                  GlobalClientOptions(), torch.device("cpu"))
            steps[name, size], weights[name, size] = metrics["steps"], update.weights

    # Assert: local-steps = 5 is 5 steps at both sites (2.5 and 5 passes); one epoch is 2 and 1;
    # min-local-steps = 2 leaves the big site's pass and stretches the small one's to 2
    assert steps == {("fixed", "big"): 5.0, ("fixed", "small"): 5.0, ("epochs", "big"): 2.0, ("epochs", "small"): 1.0,
                     ("minimum", "big"): 2.0, ("minimum", "small"): 2.0,
                     ("minimum-5", "big"): 5.0, ("minimum-5", "small"): 5.0}
    for size in ("big", "small"):  # where every round is stretched, it is local-steps' round bit for bit
        for key, value in weights["fixed", size].items():
            np.testing.assert_array_equal(weights["minimum-5", size][key], value, err_msg=key)
    for key, value in weights["epochs", "big"].items():  # a round long enough is untouched
        np.testing.assert_array_equal(weights["minimum", "big"][key], value, err_msg=key)


def test_style_augmentation_trains_on_other_images_than_the_plain_batch():
    # Prepare
    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = get_weights(SPEC.build_segmentation())

    # Execute
    trained = {}
    for probability in (0.0, 1.0):
        settings = RoundSettings(batch_size=3, local_epochs=1, max_local_steps=0, lr=1e-3, selector_lr=1e-3, seed=1,
                                 style_augmentation=probability)
        trained[probability] = train_global_client(start, _data(), SPEC, settings, GlobalClientOptions(),
                                                   torch.device("cpu"))[0].weights

    # Assert
    assert any(not np.array_equal(trained[0.0][k], v) for k, v in trained[1.0].items())
