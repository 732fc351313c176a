"""Gamma chosen on validation: pooling of per-site sweeps and the argmax."""

from __future__ import annotations

import pytest

from fedsm_core.algorithms.fedsm.gamma import (
    GAMMA_GRID,
    choose_gamma,
    choose_model_gammas,
    describe_gamma,
    pool_sweeps,
    select_gamma,
)


def test_pooled_sweep_weights_sites_by_images_and_picks_the_best_gamma():
    # Prepare: site a (1 image) is best at gamma 0, site b (3 images) at gamma 0.5
    gammas = [0.0, 0.5, 1.0]
    sweeps = {"a": ([0.9, 0.5, 0.1], 1.0), "b": ([0.2, 0.6, 0.4], 3.0)}

    # Execute
    pooled = pool_sweeps(sweeps, gammas)

    # Assert
    # gamma 0: (0.9 + 3 * 0.2) / 4 = 0.375;  0.5: (0.5 + 1.8) / 4 = 0.575;  1.0: (0.1 + 1.2) / 4 = 0.325
    assert pooled == pytest.approx([0.375, 0.575, 0.325])
    assert choose_gamma(pooled, gammas) == 0.5


def test_ties_go_to_the_smallest_gamma():
    assert choose_gamma([0.7, 0.8, 0.8], [0.1, 0.2, 0.3]) == 0.2


def test_grid_spans_zero_to_one():
    assert GAMMA_GRID[0] == 0.0 and GAMMA_GRID[-1] == 1.0 and len(GAMMA_GRID) == 21


def test_mismatched_sweep_is_rejected():
    with pytest.raises(ValueError, match="a reported 2 sweep values for 3 gammas"):
        pool_sweeps({"a": ([0.1, 0.2], 1.0)}, [0.0, 0.5, 1.0])


def test_model_gammas_maximise_each_models_gain_and_fall_back_without_evidence():
    # Prepare: gammas 0, 0.5, 1. Model 0 gains most above 0.5 (0.3 > 0.2); model 1 loses at every threshold
    # that routes images to it; model 2 ties at 0 and 0.5 (smallest wins); model 3 was never routed to.
    gammas = [0.0, 0.5, 1.0]
    gains = [0.2, 0.3, 0.0,   -0.4, -0.1, 0.0,   0.5, 0.5, 0.0,   0.0, 0.0, 0.0]
    counts = [4, 2, 0,        3, 1, 0,           2, 2, 0,         0, 0, 0]

    # Execute
    chosen = choose_model_gammas(gains, counts, gammas, fallback=0.5)

    # Assert
    assert chosen == (0.5, 1.0, 0.0, 0.5)
    assert describe_gamma(chosen[:2], ["a", "b"]) == "a 0.50, b 1.00"
    with pytest.raises(ValueError, match="gains"):
        choose_model_gammas(gains[:-1], counts, gammas, 0.5)


def test_select_gamma_follows_the_rule_and_weights_sites_by_images_with_foreground():
    # a: 2 images, 1 empty -> weight 1, best at gamma 0; b: 3 images -> weight 3, best at 1.0
    a = {"dice-super-sweep": [0.9] + [0.1] * 20, "num-images": 2.0, "num-empty": 1.0}
    b = {"dice-super-sweep": [0.2] * 20 + [0.5], "num-images": 3.0}
    validation = {"a": a, "b": b}
    # gamma 0: (0.9 + 0.6) / 4 = 0.375; gamma 1: (0.1 + 1.5) / 4 = 0.4
    assert select_gamma("validation", validation, 0.5) == 1.0
    assert select_gamma("fixed", validation, 0.5) == 0.5
    # per-model without per-model sweeps falls back to the pooled choice
    assert select_gamma("per-model", validation, 0.5) == 1.0


def test_client_average_weighs_every_site_the_same_so_small_sites_can_outvote_a_large_one():
    # large: 100 images, best at gamma 0 (0.95 against 0.90); two small sites of 5 images, best at gamma 1
    large = {"dice-super-sweep": [0.95] * 20 + [0.90], "num-images": 100.0}
    small = {"dice-super-sweep": [0.80] * 20 + [0.88], "num-images": 5.0}
    validation = {"large": large, "small-1": small, "small-2": dict(small)}
    # pooled by images: gamma 0 (95 + 4 + 4) / 110 = 0.93636 > gamma 1 (90 + 4.4 + 4.4) / 110 = 0.89818
    assert select_gamma("validation", validation, 0.5) == 0.0
    # client average: gamma 0 (0.95 + 0.80 + 0.80) / 3 = 0.85 < gamma 1 (0.90 + 0.88 + 0.88) / 3 = 0.88667
    assert select_gamma("client-average", validation, 0.5) == 1.0
    # with one site the two rules agree
    assert select_gamma("client-average", {"large": large}, 0.5) == select_gamma("validation", {"large": large}, 0.5)
