"""Centralized training as one site holding every image: a fresh Adam every round under ``optimizer-state = reset``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsm_core.algorithms.fedsm.client import segmentation_batch_fn
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.analysis.pooled import pass_optimizer_restart, train_on_arrays
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SegArrays
from fedsm_core.losses import soft_dice_loss
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.training.batches import iterate_batches
from fedsm_core.training.local_update import Learner, train_local
from fedsm_core.training.optimizer_state import new_adam

SPEC = ModelSpec("mobilenet_v2", num_structures=1, num_sites=2, selector_width=4)
SETTINGS = RoundSettings(batch_size=2, local_epochs=1, max_local_steps=0, lr=1e-2, selector_lr=1e-3, seed=0)


def _data() -> SegArrays:
    rng = np.random.default_rng(0)
    return SegArrays(rng.random((4, 3, 32, 32), dtype=np.float32),
                     (rng.random((4, 1, 32, 32)) > 0.5).astype(np.float32), tuple(f"x/{i}" for i in range(4)))


def _by_hand(data: SegArrays, passes: int) -> dict[str, np.ndarray]:
    """The federation's round protocol for one site: a new Adam before every pass, one batch stream throughout."""
    torch.manual_seed(SETTINGS.seed)
    model = SPEC.build_segmentation()
    batch_fn = segmentation_batch_fn(SETTINGS)
    generator = torch.Generator().manual_seed(SETTINGS.seed)
    for _ in range(passes):
        learner = Learner("model", model, new_adam(model.parameters(), SETTINGS.lr), soft_dice_loss,
                          batch_fn)
        train_local([learner], lambda: iterate_batches(data, SETTINGS.batch_size, shuffle=True,
                                                       augment=SETTINGS.augmentation, generator=generator), 1)
    return get_weights(model)


def test_a_restart_every_pass_is_a_fresh_adam_before_each_pass_bit_for_bit():
    # Prepare
    torch.set_num_threads(1)
    data = _data()

    # Execute
    restarted = get_weights(train_on_arrays(SPEC, data, SETTINGS, 3, {}, restart_every=1))
    kept = get_weights(train_on_arrays(SPEC, data, SETTINGS, 3, {}))
    expected = _by_hand(data, 3)

    # Assert: the restarts are what changed the result (Adam's moments and step count start again)
    for key, value in expected.items():
        np.testing.assert_array_equal(restarted[key], value, err_msg=key)
    assert any(not np.array_equal(kept[k], v) for k, v in expected.items())


def test_no_restart_within_the_passes_is_one_adam_kept_throughout():
    # Prepare: restarts every 3 passes never fire in 3 passes
    torch.set_num_threads(1)
    data = _data()

    # Execute
    late = get_weights(train_on_arrays(SPEC, data, SETTINGS, 3, {}, restart_every=3))
    kept = get_weights(train_on_arrays(SPEC, data, SETTINGS, 3, {}))

    # Assert
    for key, value in kept.items():
        np.testing.assert_array_equal(late[key], value, err_msg=key)


@pytest.mark.parametrize(("settings", "expected"), [
    ({}, 1),  # the default: optimizer-state = reset, one pass per round
    ({"local-epochs": 3}, 3),  # a round is three passes; the site's Adam lives through them
    ({"optimizer-state": "local"}, 0),  # the one site keeps its Adam
    ({"optimizer-state": "averaged", "strategy": "fedavg"}, 0),  # the average of one site's state is that state
])
def test_centralized_training_restarts_its_adam_as_the_settings_restart_a_sites(settings, expected):
    assert pass_optimizer_restart(RunConfig.from_mapping(settings)) == expected


def test_a_negative_restart_interval_is_refused():
    with pytest.raises(ValueError, match="restart_every = -1"):
        train_on_arrays(SPEC, _data(), SETTINGS, 1, {}, restart_every=-1)
