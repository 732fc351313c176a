"""KNNPerSettings: each bad value names its setting; a run's settings come from its run config."""

from __future__ import annotations

import pytest

from fedsm_core.algorithms.knn_per.settings import KNNPerSettings
from fedsm_core.config import RunConfig


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k": 0}, r"knn-k = 0 is outside \[1, 10000\]"),
        ({"capacity": -5}, r"knn-capacity = -5 is outside \[1, "),
        ({"pixels_per_image": 0}, r"knn-pixels-per-image = 0 is outside \[1, "),
        ({"k": 2.5}, "knn-k = 2.5 must be an integer"),
        ({"batch_size": 2.5}, "knn-batch-size = 2.5 must be an integer"),
        ({"seed": -1}, "knn-seed = -1 must be >= 0"),
        ({"kernel_scale": 0.0}, r"knn-kernel-scale = 0.0 is outside \[1e-09, "),
        ({"kernel_scale": float("inf")}, "knn-kernel-scale = inf"),
        ({"replacement": "lru"}, "knn-replacement = 'lru' is not one of"),
        ({"backend": "annoy"}, "knn-backend = 'annoy' is not one of"),
        ({"lambda_grid": ()}, "knn-lambda-grid is empty"),
        ({"lambda_grid": (0.0, 1.5)}, r"knn-lambda-grid = 1.5 is outside \[0.0, 1.0\]"),
        ({"lam": -0.1}, r"knn-lambda = -0.1 is outside \[0.0, 1.0\]"),
    ],
)
def test_bad_settings_name_the_setting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KNNPerSettings(**kwargs)


def test_a_runs_settings_take_its_knn_keys_and_seed():
    # Prepare
    config = RunConfig.from_mapping({"knn-k": 3, "knn-kernel-scale": 2.0, "knn-capacity": 99,
                                     "knn-pixels-per-image": 7, "seed": 5})

    # Execute
    settings = config.knn_settings

    # Assert: the run's keys, and the defaults for what a run does not set
    assert (settings.k, settings.kernel_scale, settings.capacity, settings.pixels_per_image, settings.seed) == (
        3, 2.0, 99, 7, 5)
    assert (settings.lambda_grid, settings.backend) == (KNNPerSettings().lambda_grid, "auto")
