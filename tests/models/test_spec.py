"""ModelSpec.load_segmentation: a copy of the spec's template with the given weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights


def test_a_loaded_u_net_holds_the_weights_and_leaves_the_random_state_alone():
    # Prepare
    spec = ModelSpec("mobilenet_v2", 2, 3)
    torch.manual_seed(1)
    weights = get_weights(spec.build_segmentation())
    torch.manual_seed(7)
    expected_draw = torch.rand(3)

    # Execute: a load between seeding and drawing
    torch.manual_seed(7)
    first, second = spec.load_segmentation(weights), spec.load_segmentation(weights)
    draw = torch.rand(3)

    # Assert: both copies hold the weights and are separate modules; the draw is the one without the loads
    for model in (first, second):
        for key, value in get_weights(model).items():
            np.testing.assert_array_equal(value, weights[key], err_msg=key)
    assert first is not second and next(first.parameters()) is not next(second.parameters())
    torch.testing.assert_close(draw, expected_draw)
    with pytest.raises(ValueError, match="checkpoint"):
        spec.load_segmentation({"nope": np.zeros(1)}, "checkpoint")
