"""The attack simulator's updates (hand-computed float64) and the parsing of ``attack``."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.algorithms.attacks import AttackSettings, noised, sign_flipped
from fedsm_core.command_line.preflight import check_run
from fedsm_core.config import RunConfig

SENT = {"w": np.array([1.0, 2.0]), "f": np.array([0.5], np.float32), "n": np.array(3, np.int64)}
TRAINED = {"w": np.array([2.0, 0.0]), "f": np.array([1.5], np.float32), "n": np.array(5, np.int64)}


def test_sign_flip_sends_the_honest_update_reversed_and_scaled():
    # w - s (w_k - w) with s = 2: [1, 2] - 2 [1, -2] = [-1, 6]; [0.5] - 2 [1] = [-1.5]
    flipped = sign_flipped(SENT, TRAINED, 2.0)
    np.testing.assert_array_equal(flipped["w"], [-1.0, 6.0])
    np.testing.assert_array_equal(flipped["f"], np.array([-1.5], np.float32))
    assert flipped["f"].dtype == np.float32 and int(flipped["n"]) == 5  # a counter is sent as trained


def test_noise_has_s_times_the_honest_update_norm():
    # honest norm: sqrt(1 + 4 + 1) = sqrt(6); the noise's norm is 3 sqrt(6)
    attacked = noised(SENT, TRAINED, 3.0, np.random.default_rng(0))
    step = np.concatenate([attacked["w"] - SENT["w"], np.asarray(attacked["f"], np.float64) - 0.5])
    assert np.linalg.norm(step) == pytest.approx(3.0 * np.sqrt(6.0), rel=1e-6)
    assert int(attacked["n"]) == 5


def test_the_plan_lists_sites_and_attacks_and_bad_plans_name_the_fix():
    settings = AttackSettings("site-5:noise, site-6:sign-flip,site-6:inflate-count")
    assert settings.sites == ("site-5", "site-6")
    assert settings.of("site-6") == ("sign-flip", "inflate-count") and settings.of("site-1") == ()
    with pytest.raises(ValueError, match="'site-6' is not '<site>:<attack>'"):
        AttackSettings("site-6")
    with pytest.raises(ValueError, match="attack of 'site-6' = 'explode' is not one of"):
        AttackSettings("site-6:explode")


def test_fedsm_attacks_need_fedsm_and_the_sites_must_be_the_runs():
    with pytest.raises(ValueError, match="poison-personalized.*strategy = 'fedavg' has none"):
        RunConfig.from_mapping({"strategy": "fedavg", "attack": "site-6:poison-personalized"})
    assert RunConfig.from_mapping({"strategy": "fedsm", "attack": "site-6:fake-statistics"}).attack_settings.sites
    problems = check_run({"attack": "site-9:sign-flip"}).problems
    assert any("names ['site-9'], which are not sites of the run" in problem for problem in problems)
