"""Per-channel pixel statistics and their pooling across sites."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.data.statistics import ChannelStatistics, channel_statistics, pool_channel_statistics


def test_pooled_statistics_equal_those_of_the_pooled_pixels():
    # Prepare
    rng = np.random.default_rng(0)
    a = rng.random((3, 2, 4, 4))
    b = rng.random((5, 2, 4, 4)) * 2.0 + 1.0

    # Execute
    pooled = pool_channel_statistics([channel_statistics(a), channel_statistics(b)])

    # Assert
    both = np.concatenate([a, b])
    assert pooled.count == 8 * 16
    np.testing.assert_allclose(pooled.mean, both.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(pooled.var, both.var(axis=(0, 2, 3)), rtol=1e-10)


def test_hand_computed_two_sites():
    # site A: 2 pixels of 0 -> mean 0, var 0;  site B: 2 pixels of 2 -> mean 2, var 0
    # pooled: mean = (2 * 0 + 2 * 2) / 4 = 1;  var = (2 * 0 + 2 * 4) / 4 - 1 = 1
    pooled = pool_channel_statistics([ChannelStatistics(2, (0.0,), (0.0,)), ChannelStatistics(2, (2.0,), (0.0,))])
    assert pooled.mean == (1.0,) and pooled.var == (1.0,) and pooled.std == (1.0,)


def test_bad_inputs_are_explained():
    with pytest.raises(ValueError, match="no statistics"):
        pool_channel_statistics([])
    with pytest.raises(ValueError, match="different channel counts"):
        pool_channel_statistics([ChannelStatistics(1, (0.0,), (0.0,)), ChannelStatistics(1, (0.0, 1.0), (0.0, 0.0))])
    with pytest.raises(ValueError, match=r"got shape \(2, 2\)"):
        channel_statistics(np.zeros((2, 2)))
