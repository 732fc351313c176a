"""The stopping rule on hand-made validation curves, where a run checks it, and the run-config keys that set it."""

from __future__ import annotations

import math

import pytest

from fedsm_core.config import RunConfig
from fedsm_core.training.stopping_rule import (
    StoppingRule,
    gain_over_window,
    stopping_round,
    stops_after,
    validation_curve,
)

RULE = StoppingRule(min_rounds=60, max_rounds=150, window=20, min_gain=0.002, check_every=10)


def _curve(values: dict[int, float]) -> list[tuple[int, float]]:
    return sorted(values.items())


def test_gain_is_the_rise_of_the_best_value_over_the_window():
    # best(<= 60) = 0.80 (round 50), best(<= 40) = 0.79 (round 40): gain 0.01
    curve = _curve({20: 0.70, 40: 0.79, 50: 0.80, 60: 0.78})
    assert gain_over_window(curve, 60, 20) == pytest.approx(0.01)
    assert gain_over_window(curve, 45, 20) == pytest.approx(0.09)  # best(<= 45) 0.79 - best(<= 25) 0.70
    assert math.isinf(gain_over_window(curve, 25, 20))  # no round <= 5 was evaluated


def test_a_curve_still_climbing_at_the_minimum_runs_on():
    # +0.01 every 5 rounds: the last 20 rounds gained 0.04 >= 0.002
    curve = [(r, 0.5 + 0.002 * r) for r in range(5, 65, 5)]
    assert stopping_round(curve, RULE) is None
    assert not stops_after(curve, 60, RULE)


def test_a_flat_curve_stops_at_the_minimum_not_before():
    # Flat from round 20 on: the rule holds from round 40, but a run lasts at least 60 rounds.
    curve = [(r, min(0.8, 0.04 * r)) for r in range(5, 65, 5)]
    assert stopping_round(curve, RULE) == 60
    assert not any(stops_after(curve, r, RULE) for r in range(40, 60))
    assert stops_after(curve, 60, RULE)


def test_a_gain_just_below_the_threshold_stops_and_just_above_does_not():
    # Round 80: best(<= 80) - best(<= 60) = 0.0019 < 0.002 stops; 0.0021 does not.
    base = {r: 0.7 + 0.001 * r for r in range(5, 65, 5)}  # climbing until 60: 0.76
    below = _curve({**base, 70: 0.7610, 80: 0.7619})
    above = _curve({**base, 70: 0.7610, 80: 0.7621})
    assert stopping_round(below, RULE) == 80 and stops_after(below, 80, RULE)
    assert stopping_round(above, RULE) is None and not stops_after(above, 80, RULE)


def test_the_rule_is_looked_at_only_on_check_rounds_so_a_resumed_run_stops_where_one_piece_would():
    # The gain over 20 rounds first drops below 0.002 at round 65 (0.80 from round 45 on),
    # but the run checks at 60, 70, 80: it stops after round 70, as a study extending it 10 rounds at a time did.
    curve = _curve({**{r: 0.5 + 0.006 * r for r in range(5, 45, 5)}, **{r: 0.80 for r in range(45, 75, 5)}})
    assert stopping_round(curve, RULE) == 65
    assert [r for r in range(60, 71) if stops_after(curve, r, RULE)] == [70]


def test_a_run_stops_early_only_right_after_a_validation_round():
    rule = StoppingRule(min_rounds=1, max_rounds=100, window=10, min_gain=0.002, check_every=1)
    curve = [(r, 0.8) for r in range(5, 35, 5)]  # flat; validated every 5 rounds
    assert stopping_round(curve, rule) == 15
    assert [r for r in range(1, 31) if stops_after(curve, r, rule)] == [15, 20, 25, 30]


def test_a_curve_that_never_settles_stops_at_the_maximum():
    curve = [(r, 0.3 + 0.003 * r) for r in range(5, 155, 5)]
    assert stopping_round(curve, RULE) == 150
    assert not stops_after(curve[:-2], 140, RULE)
    assert stops_after(curve, 150, RULE)


def test_a_drop_counts_as_no_gain():
    # The best value so far is what counts: a falling curve has gained nothing.
    curve = _curve({**{r: 0.5 + 0.005 * r for r in range(5, 65, 5)}, 70: 0.6, 80: 0.55})
    assert stopping_round(curve, RULE) == 80


def test_the_curve_is_the_pooled_validation_score_and_falls_back_to_the_global_model():
    rows = [(10, "val", "pooled", "dice-super", 0.7), (5, "val", "pooled", "dice-super", 0.6),
            (5, "val", "site-1", "dice-super", 0.1), (10, "test", "pooled", "dice-super", 0.9),
            (5, "val", "pooled", "dice-global", 0.5)]
    assert validation_curve(rows, "dice-super") == [(5, 0.6), (10, 0.7)]
    assert validation_curve(rows, "dice-knn-per") == [(5, 0.5)]  # kNN-Per is scored only at test time


def test_the_stop_keys_set_the_rule_up_to_num_server_rounds_and_zero_turns_it_off():
    assert RunConfig().stopping_rule is None
    config = RunConfig.from_mapping({"num-server-rounds": 150, "stop-window": 20, "stop-min-rounds": 60,
                                     "stop-check-every": 10, "stop-min-gain": 0.002})
    assert config.stopping_rule == RULE


@pytest.mark.parametrize(("values", "match"), [
    ({"num-server-rounds": 50, "stop-window": 20, "stop-min-rounds": 60}, r"stop-min-rounds = 60 is outside \[1, 50\]"),
    ({"stop-window": -1}, r"stop-window = -1 is outside"),
    ({"stop-window": 20, "stop-check-every": 0}, r"stop-check-every = 0 is outside"),
    ({"stop-window": 20, "strategy": "fedsm-extra"}, "extra selector rounds start at num-server-rounds"),
])
def test_stop_keys_that_cannot_work_fail_naming_the_key(values, match):
    with pytest.raises(ValueError, match=match):
        RunConfig.from_mapping(values)
