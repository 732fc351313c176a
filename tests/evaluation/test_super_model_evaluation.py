"""Super-model evaluation: the per-model sweeps restate the super model's Dice at any gamma per model."""

from __future__ import annotations

import numpy as np
import pytest
from support.tiny_super_model import ChannelSelector, Threshold, tiny_site

from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.algorithms.fedsm.super_model import SuperModel
from fedsm_core.evaluation.super_model_evaluation import evaluate_super_model


@pytest.mark.parametrize("gammas", [(0.0, 0.0, 0.0), (0.6, 1.0, 0.3), (1.0, 0.45, 0.9)])
def test_dice_at_a_gamma_per_model_equals_global_dice_plus_the_swept_gains(gammas):
    # Prepare: global model slightly off, personalized models better (0), worse (1) and far off (2)
    personalized = [Threshold(0.5), Threshold(0.7), Threshold(0.2)]
    model = SuperModel(Threshold(0.55), personalized, ChannelSelector(3), 0.5)
    data = tiny_site(0)

    # Execute: one validation pass with the sweeps, and one evaluation at the per-model gammas
    swept = evaluate_super_model(model, 0, data, batch_size=5, gammas=GAMMA_GRID)
    model.gamma = gammas
    direct = evaluate_super_model(model, 0, data, batch_size=5)

    # Assert: Dice_super = Dice_global + sum_m gain[m, g_m] / n, and the share routed to global likewise
    size = len(GAMMA_GRID)
    gains = np.reshape(swept["routing-gain-sweep"], (3, size))
    counts = np.reshape(swept["routed-count-sweep"], (3, size))
    index = [GAMMA_GRID.index(g) for g in gammas]
    n = swept["num-images"]
    restated = swept["dice-global"] + sum(gains[m, i] for m, i in enumerate(index)) / n
    assert restated == pytest.approx(direct["dice-super"], abs=1e-9)
    assert 1 - sum(counts[m, i] for m, i in enumerate(index)) / n == pytest.approx(direct["share-global"])
    assert direct["gamma"] == gammas[0]  # the threshold of site 0's own model


def test_one_gamma_for_all_models_is_the_scalar_sweep():
    model = SuperModel(Threshold(0.55), [Threshold(0.5), Threshold(0.7), Threshold(0.2)], ChannelSelector(3), 0.5)
    swept = evaluate_super_model(model, 1, tiny_site(1), gammas=GAMMA_GRID)
    gains = np.reshape(swept["routing-gain-sweep"], (3, len(GAMMA_GRID))).sum(axis=0)

    np.testing.assert_allclose(swept["dice-global"] + gains / swept["num-images"], swept["dice-super-sweep"],
                               atol=1e-9)
