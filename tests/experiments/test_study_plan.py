"""The study plan and its stopping rule: hand-made validation curves, and plans with mistakes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from experiments.study_plan import StoppingRule, gain_over_window, load_plan, next_target, stopping_round

RULE = StoppingRule(min_rounds=60, max_rounds=150, window=20, min_gain=0.002, check_every=10)
ROOT = Path(__file__).resolve().parents[2]


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
    assert next_target(curve, 60, RULE) == 70


def test_a_flat_curve_stops_at_the_minimum_not_before():
    # Flat from round 20 on: the rule holds from round 40, but a run lasts at least 60 rounds.
    curve = [(r, min(0.8, 0.04 * r)) for r in range(5, 65, 5)]
    assert stopping_round(curve, RULE) == 60
    assert next_target(curve, 60, RULE) == 60


def test_a_gain_just_below_the_threshold_stops_and_just_above_does_not():
    # Round 80: best(<= 80) - best(<= 60) = 0.0019 < 0.002 stops; 0.0021 does not.
    base = {r: 0.7 + 0.001 * r for r in range(5, 65, 5)}  # climbing until 60: 0.76
    below = _curve({**base, 70: 0.7610, 80: 0.7619})
    above = _curve({**base, 70: 0.7610, 80: 0.7621})
    assert stopping_round(below, RULE) == 80
    assert stopping_round(above, RULE) is None
    assert next_target(above, 80, RULE) == 90


def test_a_curve_that_never_settles_stops_at_the_maximum():
    curve = [(r, 0.3 + 0.003 * r) for r in range(5, 155, 5)]
    assert stopping_round(curve, RULE) == 150
    assert next_target(curve, 150, RULE) == 150
    assert next_target(curve[:-2], 140, RULE) == 150  # the last extension is cut at max-rounds


def test_a_drop_counts_as_no_gain():
    # The best value so far is what counts: a falling curve has gained nothing.
    curve = _curve({**{r: 0.5 + 0.005 * r for r in range(5, 65, 5)}, 70: 0.6, 80: 0.55})
    assert stopping_round(curve, RULE) == 80


def _plan(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return path


GOOD = """
[study]
datasets = ["synthetic-fundus"]
methods = ["fedavg", "centralized"]
seeds = [0]
[methods]
centralized = { rounds-from = "fedavg" }
"""


def test_the_reference_plan_is_valid_and_orders_every_dependency():
    plan = load_plan(ROOT / "experiments" / "plans" / "reference.toml")
    assert len(plan.jobs()) == 3 * 3 * 7
    assert plan.stopping == RULE
    assert plan.rounds_from == {"centralized": "fedavg", "fedsm-extra": "fedsm"}


@pytest.mark.parametrize(("text", "match"), [
    (GOOD.replace('"fedavg", "centralized"', '"fedavg", "fedsmm"'), r"methods \['fedsmm'\] are unknown"),
    (GOOD.replace('"fedavg", "centralized"', '"centralized", "fedavg"'), "rounds-from = a method listed before"),
    (GOOD + "[stopping]\nmin-rounds = 80\nmax-rounds = 60\n", "min-rounds <= max-rounds"),
    (GOOD + "[stopping]\npatience = 3\n", r"\['patience'\] are not settings"),
    (GOOD + "[run-config]\nnum-server-rounds = 5\n", r"\['num-server-rounds'\] are set by the study"),
    (GOOD + "[run-config]\nlr = -1.0\n", "dataset synthetic-fundus, method fedavg"),
    (GOOD.replace("seeds = [0]", "seeds = []"), r"seeds = \[\] must be a non-empty list"),
    (GOOD + '[chosen]\n"synthetic-prostate" = "x.json"\n', r"\['synthetic-prostate'\] are not datasets"),
])
def test_a_plan_with_a_mistake_names_the_file_and_the_setting(tmp_path, text, match):
    path = _plan(tmp_path, text)
    with pytest.raises(ValueError, match=match) as error:
        load_plan(path)
    assert str(path) in str(error.value)
