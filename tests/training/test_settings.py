"""Local training's settings: how many minibatches a site takes in a round, and when to suggest more."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SegArrays
from fedsm_core.training.local_update import Learner, train_on_split

SETTINGS = [{}, {"local-steps": 5}, {"min-local-steps": 5}, {"max-local-steps": 3}, {"local-epochs": 2},
            {"min-local-steps": 5, "max-local-steps": 7}]


@pytest.mark.parametrize("values", SETTINGS, ids=lambda v: " ".join(f"{k}={x}" for k, x in v.items()) or "defaults")
def test_steps_in_round_is_what_the_local_loop_takes(values):
    training = RunConfig.from_mapping({**values, "batch-size": 4}).training_settings
    epochs, cap = training.epochs_and_steps()
    for count in (1, 2, 4, 5, 9, 17):
        images = np.zeros((count, 1, 2, 2), np.float32)
        model = nn.Conv2d(1, 1, 1)
        learner = Learner("a", model, torch.optim.SGD(model.parameters(), lr=0.0), lambda out, y: (out - y).mean())
        taken = train_on_split([learner], SegArrays(images, images, tuple(map(str, range(count)))), 4, epochs, cap,
                               0, augmentation="none", min_steps=training.min_local_steps)["steps"]
        assert training.steps_in_round(count) == taken, count


def test_a_federation_of_short_rounds_gets_the_hint_and_one_with_a_long_round_does_not():
    training = RunConfig().training_settings  # batch 8
    hint = training.short_round_hint({"site-1": 4, "site-2": 12, "site-3": 22})  # 1, 2 and 3 minibatches
    assert hint is not None and "(site-1 1, site-2 2, site-3 3)" in hint and "min-local-steps = 8" in hint
    assert training.short_round_hint({"site-1": 12, "site-2": 100}) is None  # the fundus datasets: 2 ... 13
    assert training.short_round_hint({"site-1": 25, "site-2": 32}) is None  # 4 minibatches: long enough
    for values in ({"min-local-steps": 8}, {"local-steps": 2}):  # the user already chose
        assert RunConfig.from_mapping(values).training_settings.short_round_hint({"site-1": 4}) is None
