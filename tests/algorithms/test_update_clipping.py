"""Update-norm clipping: hand-computed norms and scales, counters untouched, and its place before the average."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.algorithms.robust_aggregation import AggregationSettings
from fedsm_core.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerSettings
from fedsm_core.algorithms.update_clipping import clip_updates, update_norms

START = {"a": np.zeros(2), "b": np.zeros(1, np.float32), "n": np.array(5, np.int64)}


def _site(a: tuple[float, float], b: float, n: int = 7) -> dict[str, np.ndarray]:
    return {"a": np.array(a), "b": np.array([b], np.float32), "n": np.array(n, np.int64)}


def test_norms_and_the_clip_by_hand():
    # Prepare: update norms sqrt(3^2 + 4^2 + 0) = 5, sqrt(0 + 0 + 1) = 1, sqrt(30^2 + 40^2) = 50
    sites = [_site((3.0, 4.0), 0.0), _site((0.0, 0.0), 1.0), _site((30.0, 40.0), 0.0)]

    # Execute: bound = 2 * median(5, 1, 50) = 10
    norms = update_norms(START, sites)
    clipped = clip_updates(START, sites, 2.0)

    # Assert: the first two are within the bound; the third is scaled by 10 / 50
    assert norms == pytest.approx([5.0, 1.0, 50.0], rel=1e-15)
    np.testing.assert_array_equal(clipped[0]["a"], [3.0, 4.0])
    np.testing.assert_array_equal(clipped[1]["b"], np.array([1.0], np.float32))
    np.testing.assert_allclose(clipped[2]["a"], [6.0, 8.0], rtol=1e-15)
    assert clipped[2]["b"].dtype == np.float32 and int(clipped[2]["n"]) == 7  # counters are not updates


def test_the_server_optimizer_clips_before_it_averages_and_zero_turns_it_off():
    # Prepare
    sites = [_site((3.0, 4.0), 0.0), _site((0.0, 0.0), 1.0), _site((30.0, 40.0), 0.0)]
    clipping = ServerOptimizer(ServerOptimizerSettings(), AggregationSettings("mean", clip_update_norm=2.0))
    plain = ServerOptimizer(ServerOptimizerSettings(), AggregationSettings("mean"))

    # Execute
    clipped = clipping.aggregate(START, sites, [1, 1, 1], [1, 1, 1], 1)
    averaged = plain.aggregate(START, sites, [1, 1, 1], [1, 1, 1], 1)

    # Assert: mean of (3, 4), (0, 0), (6, 8) against mean of (3, 4), (0, 0), (30, 40)
    np.testing.assert_allclose(clipped["a"], [3.0, 4.0], rtol=1e-15)
    np.testing.assert_allclose(averaged["a"], [11.0, 44.0 / 3.0], rtol=1e-15)


def test_a_factor_of_zero_is_refused_by_the_function():
    with pytest.raises(ValueError, match="clip-update-norm = 0"):
        clip_updates(START, [_site((1.0, 1.0), 0.0)], 0.0)
