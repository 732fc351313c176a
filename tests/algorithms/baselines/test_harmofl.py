"""HarmoFL's server side: the global amplitude, bias-corrected, then fixed."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.algorithms.baselines.harmofl import (
    AMPLITUDE,
    BATCHES,
    FROZEN,
    AmplitudeSchedule,
    corrected_amplitude,
    global_amplitude,
    with_fixed_amplitude,
)


def _site(amplitude: list[float], batches: int, frozen: int = 0) -> dict[str, np.ndarray]:
    return {AMPLITUDE: np.array(amplitude, dtype=np.float32).reshape(1, 1, -1),
            FROZEN: np.array(frozen, dtype=np.int64), BATCHES: np.array(batches, dtype=np.int64),
            "net.w": np.zeros(2, dtype=np.float32)}


def test_the_running_average_is_bias_corrected_for_its_batch_count():
    # Prepare: v = 0.5, two batches -> the buffer holds 1 - 0.5^2 = 0.75 of the mean amplitude
    site = _site([3.0, 1.5], batches=2)

    # Execute
    corrected = corrected_amplitude(site, decay=0.5)

    # Assert
    np.testing.assert_allclose(corrected.ravel(), [4.0, 2.0], rtol=1e-12)
    assert corrected.dtype == np.float64


def test_a_fixed_or_unused_amplitude_is_not_corrected():
    np.testing.assert_allclose(corrected_amplitude(_site([3.0], 2, frozen=1), 0.5).ravel(), [3.0])
    np.testing.assert_allclose(corrected_amplitude(_site([3.0], 0), 0.5).ravel(), [3.0])


def test_the_global_amplitude_is_the_size_weighted_mean_of_corrected_amplitudes():
    # Prepare: v = 0.5; site a (1 batch, factor 0.5), site b (2 batches, factor 0.75)
    sites = [_site([1.0, 2.0], 1), _site([3.0, 0.75], 2)]

    # Execute
    amplitude = global_amplitude(sites, sizes=[10, 30], decay=0.5)

    # Assert: corrected a = [2, 4], b = [4, 1]; (10 [2, 4] + 30 [4, 1]) / 40 = [3.5, 1.75]
    np.testing.assert_allclose(amplitude.ravel(), [3.5, 1.75], rtol=1e-12)


def test_fixing_writes_the_amplitude_and_the_flag_and_leaves_the_rest():
    # Prepare
    site = _site([1.0, 2.0], 3)

    # Execute
    fixed = with_fixed_amplitude(site, np.array([[[7.0, 8.0]]]))

    # Assert
    np.testing.assert_array_equal(fixed[AMPLITUDE].ravel(), [7.0, 8.0])
    assert fixed[AMPLITUDE].dtype == np.float32
    assert int(fixed[FROZEN]) == 1
    assert fixed["net.w"] is site["net.w"]
    assert int(site[FROZEN]) == 0  # the input is not modified


def test_the_schedule_fixes_once_in_its_round_and_never_for_zero():
    schedule = AmplitudeSchedule(freeze_round=2, decay=0.5)
    assert [schedule.due(r) for r in (1, 2, 3)] == [False, True, False]
    assert not any(AmplitudeSchedule(freeze_round=0).due(r) for r in range(1, 5))


def test_the_schedule_gives_every_model_the_same_global_amplitude():
    # Prepare
    schedule = AmplitudeSchedule(freeze_round=1, decay=1.0)
    sites = [_site([2.0], 1), _site([4.0], 1)]
    models = {"global": _site([0.0], 0), "site-a": _site([9.0], 5)}

    # Execute
    fixed = schedule.fix(sites, [1, 1], models)

    # Assert
    for weights in fixed.values():
        np.testing.assert_allclose(weights[AMPLITUDE].ravel(), [3.0])
        assert int(weights[FROZEN]) == 1


def test_models_without_amplitude_normalization_are_refused_by_name():
    plain = {"net.w": np.zeros(2)}
    with pytest.raises(ValueError, match="amplitude normalization"):
        global_amplitude([plain], [1], 0.1)
    with pytest.raises(ValueError, match="positive sum"):
        global_amplitude([_site([1.0], 1)], [0], 0.1)
    with pytest.raises(ValueError, match="shape"):
        with_fixed_amplitude(_site([1.0, 2.0], 1), np.ones(3))
