"""The learning rate over rounds: hand-computed factors, the sites' rounds and centralized passes alike."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.analysis.pooled import pass_lr_factor, train_on_arrays
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SegArrays
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.training.lr_schedule import LRSchedule


def test_constant_without_warm_up_is_today_s_lr():
    schedule = LRSchedule()
    assert [schedule.factor(r, 10) for r in (1, 5, 10, 11)] == [1.0, 1.0, 1.0, 1.0]
    config = RunConfig.from_mapping({"lr": 0.002})
    assert config.round_settings(7, 2).lr == 0.002


def test_cosine_with_warm_up_by_hand():
    # W = 2 warm-up rounds of 10: 1/3, 2/3; then T = 8 decay rounds from 1 down to m = 0.1 at round 10
    schedule = LRSchedule("cosine", warmup_rounds=2, min_factor=0.1)
    assert schedule.factor(1, 10) == pytest.approx(1 / 3, abs=1e-15)
    assert schedule.factor(2, 10) == pytest.approx(2 / 3, abs=1e-15)
    assert schedule.factor(3, 10) == pytest.approx(1.0, abs=1e-15)
    # round 5: s = 2 of T - 1 = 7
    assert schedule.factor(5, 10) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 2 / 7)) / 2, abs=1e-15)
    assert schedule.factor(10, 10) == pytest.approx(0.1, abs=1e-15)
    assert schedule.factor(12, 10) == pytest.approx(0.1, abs=1e-15)  # an extended run stays at the floor


def test_sites_and_centralized_passes_follow_the_same_curve():
    config = RunConfig.from_mapping({"lr-schedule": "cosine", "lr-warmup-rounds": 1, "num-server-rounds": 6,
                                     "local-epochs": 2, "lr": 0.01})
    schedule = config.training_settings.schedule
    per_pass = pass_lr_factor(config)
    for server_round in range(1, 7):
        assert config.round_settings(server_round, 0).lr == pytest.approx(0.01 * schedule.factor(server_round, 6))
        # each round is two passes at that round's rate
        assert per_pass(2 * server_round - 1) == per_pass(2 * server_round) == schedule.factor(server_round, 6)


def test_bad_schedule_settings_name_the_key():
    with pytest.raises(ValueError, match="lr-schedule = 'step' is not one of"):
        LRSchedule("step")
    with pytest.raises(ValueError, match="lr-min-factor = 2.0 is outside"):
        LRSchedule("cosine", min_factor=2.0)


def test_centralized_training_applies_the_factor_of_each_pass():
    # Prepare: two passes; a factor of 0 in both leaves the model where it started, 1 then 0 moves it once
    torch.set_num_threads(1)
    spec = ModelSpec("mobilenet_v2", num_structures=1, num_sites=2, selector_width=4)
    rng = np.random.default_rng(0)
    data = SegArrays(rng.random((4, 3, 32, 32), dtype=np.float32),
                     (rng.random((4, 1, 32, 32)) > 0.5).astype(np.float32), tuple(f"x/{i}" for i in range(4)))
    settings = RoundSettings(batch_size=2, local_epochs=1, max_local_steps=0, lr=1e-2, selector_lr=1e-3, seed=0)
    torch.manual_seed(0)
    start = get_weights(spec.build_segmentation())

    # Execute
    frozen = get_weights(train_on_arrays(spec, data, settings, 2, {}, lr_factor=lambda epoch: 0.0))
    once = get_weights(train_on_arrays(spec, data, settings, 2, {}, lr_factor=lambda epoch: float(epoch == 1)))

    # Assert (batch-norm free: GroupNorm, so only parameters could move)
    assert all(np.array_equal(frozen[k], v) for k, v in start.items())
    assert any(not np.array_equal(once[k], v) for k, v in start.items())
