"""A site's evaluation metrics are refused when no evaluation could produce them, and cannot then choose gamma."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import MessageType
from support.server_fakes import LAM, NODE, NODES, SITES, EvaluationLog, reply, w

from app_protocol import records
from fedsm_core.algorithms.fedsm.fedsm import FedSM
from server_app.metric_bounds import check_metrics
from server_app.round_plan import RoundPlan
from server_app.strategies.fedsm import FedSMStrategy

GRID = 21


def _honest() -> tuple[dict[str, float], dict[str, list[float]]]:
    """Metrics of a FedSM validation at a site with 5 images, one of them empty."""
    numbers = {"dice-global": 0.8, "dice-super": 0.85, "dice-personal": 0.7, "share-global": 0.4, "num-images": 5.0,
               "num-empty": 1.0, "empty-fp-super": 0.0, "selector-accuracy": 0.6, "gamma": 0.3,
               "case-dice-super": math.nan, "case-hd95-super": math.nan, "num-routed-global": 2.0}
    lists = {"dice-super-sweep": [0.85] * GRID, "share-global-sweep": [0.4] * GRID,
             "routing-gain-sweep": [-0.5, 1.5] * GRID, "routed-count-sweep": [3.0, 0.0] * GRID}
    return numbers, lists


def test_an_honest_evaluation_passes_with_nan_where_nothing_was_scored():
    numbers, lists = _honest()
    check_metrics(numbers, lists, reported_images=5)
    check_metrics(numbers, lists, reported_images=None)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("dice-super", 1.5, r"dice-super = 1.5 is outside \[0, 1\]"),
    ("selector-accuracy", -0.1, "selector-accuracy = -0.1 is outside"),
    ("num-empty", 6.0, r"num-empty = 6.0 is outside \[0, 5\]"),
    ("num-routed-0", -1.0, "num-routed-0 = -1.0 is outside"),
    ("case-hd95-super", math.inf, "case-hd95-super = inf is not finite"),
    ("num-images", 2.5, "num-images = 2.5; expected a whole number"),
    ("num-images", 6.0, "num-images = 6 is more than the 5 images the site reported"),
])
def test_a_number_no_evaluation_can_produce_is_named(key, value, message):
    numbers, lists = _honest()
    numbers[key] = value

    with pytest.raises(ValueError, match=message):
        check_metrics(numbers, lists, reported_images=5)


@pytest.mark.parametrize(("key", "bad", "message"), [
    ("dice-super-sweep", 2.0, r"dice-super-sweep = 2.0 is outside \[0, 1\]"),
    ("routed-count-sweep", 9.0, r"routed-count-sweep = 9.0 is outside \[0, 5\]"),
    ("routing-gain-sweep", -7.0, r"routing-gain-sweep = -7.0 is outside \[-5, 5\]"),
])
def test_a_sweep_value_out_of_bounds_is_named(key, bad, message):
    numbers, lists = _honest()
    lists[key] = [*lists[key][:-1], bad]

    with pytest.raises(ValueError, match=message):
        check_metrics(numbers, lists, reported_images=5)


def _validation_reply(site: str, sweep: list[float], images: float):
    metrics = records.to_metrics({"dice-super": sweep[0], "share-global": 0.0, "num-images": images,
                                  "dice-super-sweep": sweep, "share-global-sweep": [0.0] * GRID})
    return reply(NODE[site], {records.METRICS: metrics}, MessageType.EVALUATE)


def test_a_site_that_inflates_its_validation_cannot_choose_gamma_for_everyone():
    # Prepare: a and b (4 images each) are best at gamma 0.30; c claims 1000 images (it reported 8) and a
    # Dice of 1 at gamma 0: pooled by images, c alone would choose gamma 0
    fedsm = FedSM(SITES, w(0.0, 0.0), {"s": np.array([0.0])}, LAM)
    log = EvaluationLog()
    strategy = FedSMStrategy(fedsm, NODES, RoundPlan(5, 1), log, gamma=0.5, gamma_selection="validation")
    honest = [0.8 if i == 6 else 0.6 for i in range(GRID)]
    steering = [1.0] + [0.0] * (GRID - 1)

    # Execute
    replies = [_validation_reply("site-a", honest, 4), _validation_reply("site-b", honest, 4),
               _validation_reply("site-c", steering, 1000)]
    strategy.collect_evaluation(5, "val", replies)

    # Assert: c's reply is refused as a whole, recorded as its gap; a and b choose gamma 0.30
    assert strategy.gamma == 0.3
    (_, _, per_site), = log.calls
    assert set(per_site) == {"site-a", "site-b"}
    assert "num-images = 1000 is more than the 8 images" in strategy.evaluation_gaps["val"]["site-c"]
