"""The speed table: rounds to centralized's best validation Dice minus one point, checked on hand-made curves."""

from __future__ import annotations

import pytest

from experiments.study import run_configs
from experiments.study.runs import write_rows
from experiments.study.speed_table import (
    passes_after_last_round,
    rounds_to,
    rounds_to_target,
    speed_table,
    validation_curves,
)
from experiments.study.table import study_table_of


def _val(method: str, seed: int, curve: list[tuple[int, float]], dataset: str = "d") -> list[dict[str, str]]:
    return [{"dataset": dataset, "method": method, "seed": str(seed), "kind": "val", "round": str(r),
             "site": "pooled", "image": "", "value": repr(v)} for r, v in curve]


# Seed 0: centralized peaks at 0.95, target 0.94, reached at pass 3; seed 1: peak 0.90, target 0.89, pass 2.
ROWS = [
    *_val("centralized", 0, [(1, 0.80), (2, 0.93), (3, 0.945), (4, 0.95)]),
    *_val("centralized", 1, [(1, 0.85), (2, 0.895), (3, 0.90)]),
    *_val("fedavg", 0, [(5, 0.90), (10, 0.941)]),       # 10 rounds = 3.33 x 3 passes
    *_val("fedavg", 1, [(5, 0.89), (10, 0.95)]),        # 5 rounds = 2.5 x 2 passes
    *_val("fedsm", 0, [(5, 0.9399), (10, 0.90)]),       # never reaches 0.94
    *_val("fedsm", 1, [(5, 0.80), (10, 0.90)]),         # 10 / 2 = 5
    {"dataset": "d", "method": "fedavg", "seed": "0", "kind": "test", "round": "10", "site": "site-1",
     "image": "", "value": "0.5"},
    *_val("fedavg", 0, [(5, 0.99)], dataset="other"),
]


def test_rounds_to_is_the_first_round_that_reaches_the_target_in_any_row_order():
    curve = [(15, 0.92), (5, 0.70), (10, 0.85), (20, 0.91)]
    assert rounds_to(curve, 0.90) == 15
    assert rounds_to(curve, 0.85) == 10
    assert rounds_to(curve, 0.93) is None


def test_validation_curves_keep_one_dataset_and_only_validation_rows():
    curves = validation_curves(ROWS, "d")
    assert sorted(curves) == ["centralized", "fedavg", "fedsm"]
    assert curves["fedavg"]["0"] == [(5, 0.90), (10, 0.941)]


def test_each_seed_is_measured_against_its_own_centralized_peak():
    reached = rounds_to_target(validation_curves(ROWS, "d"))
    assert reached["centralized"] == {"0": 3, "1": 2}
    assert reached["fedavg"] == {"0": 10, "1": 5}
    assert reached["fedsm"] == {"0": None, "1": 10}


def test_a_seed_without_a_centralized_run_has_no_target():
    rows = [*ROWS, *_val("fedavg", 2, [(5, 0.99)])]
    assert "2" not in rounds_to_target(validation_curves(rows, "d"))["fedavg"]


def test_the_table_gives_ratios_to_centralized_passes_and_counts_seeds_within_twice():
    lines = speed_table(ROWS, "d", {"fedavg": "FedAvg"})
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ") and "---" not in line}
    assert rows["centralized"] == "| centralized | 3/2 | 1.00/1.00 | 1.00 | 2 of 2 seeds |"
    # 10/3 = 3.33, 5/2 = 2.50, mean 2.92; neither within twice
    assert rows["FedAvg"] == "| FedAvg | 10/5 | 3.33/2.50 | 2.92 | 0 of 2 seeds |"
    # a seed that never reaches the target leaves no mean: a mean over the other seeds would flatter the method
    assert rows["fedsm"] == "| fedsm | -/10 | -/5.00 | - | 0 of 2 seeds |"


@pytest.mark.parametrize("margin, expected", [(0.0, "| FedAvg | -/10 |"), (0.02, "| FedAvg | 10/5 |")])
def test_the_margin_sets_the_target(margin, expected):
    lines = speed_table(ROWS, "d", {"fedavg": "FedAvg"}, margin=margin)
    assert any(line.startswith(expected) for line in lines)


def test_no_table_without_centralized_training():
    rows = [r for r in ROWS if r["method"] != "centralized"]
    assert speed_table(rows, "d", {}) == []


def _record(method: str, run: str, passes: int) -> dict[str, object]:
    return {"dataset": "d", "method": method, "seed": 0, "run": run, "source": "s",
            "config": {"fine-tune-passes": passes, "strategy": "fedsm"}}


def test_only_fedsm_runs_that_fine_tune_count_passes_after_their_last_round():
    records = [_record("fedsm", "a", 30), _record("fedsm-softpull", "b", 0), _record("fedsm-extra", "c", 30),
               _record("fedavg", "d", 30), _record("centralized", "e", 30), _record("fedsm-knn-per", "f", 12)]
    # fedsm-extra's strategy and the single-model strategies ignore fine-tune-passes; centralized is not a strategy
    assert passes_after_last_round(records) == {"a": 30, "f": 12}


def _with_run(rows: list[dict[str, str]], run: str) -> list[dict[str, str]]:
    return [{**row, "run": run} for row in rows]


def test_fine_tuning_passes_move_the_last_point_and_can_take_a_method_past_twice():
    # seed 0: centralized reaches 0.94 at pass 3; FedSM only at its last round 5 (5 / 3 = 1.67, within twice),
    # but after 30 local passes of fine-tuning the point sits at 35 (11.67 times)
    fedsm = _with_run(_val("fedsm", 0, [(5, 0.945), (4, 0.90)]), "tuned")
    rows = [*_val("centralized", 0, [(1, 0.80), (2, 0.93), (3, 0.945), (4, 0.95)]), *fedsm]
    assert validation_curves(rows, "d", {"tuned": 30})["fedsm"]["0"] == [(4, 0.90), (35, 0.945)]
    assert validation_curves(rows, "d", {"other": 30})["fedsm"]["0"] == [(4, 0.90), (5, 0.945)]
    plain = speed_table(rows, "d", {})
    tuned = speed_table(rows, "d", {}, after_last={"tuned": 30})
    assert "| fedsm | 5 | 1.67 | 1.67 | 1 of 1 seeds |" in plain and "fine-tuning" not in plain[0]
    assert "| fedsm | 35 | 11.67 | 11.67 | 0 of 1 seeds |" in tuned
    assert "the 30 local passes of its final fine-tuning" in tuned[0]


def test_the_study_table_of_a_folder_counts_the_fine_tuning_its_run_configs_record(tmp_path):
    # Prepare: FedSM reaches centralized's 0.94 at its last round, 10 (3.33 times 3 passes), after fine-tuning
    curves = [*_val("centralized", 0, [(1, 0.80), (2, 0.93), (3, 0.945), (4, 0.95)]),
              *_val("fedsm", 0, [(5, 0.90), (10, 0.945)])]
    rows = [{**row, "run": row["method"]} for row in curves]
    rows += [{**row, "kind": "test", "site": "site-1", "value": "0.5"} for row in rows if row["round"] in ("4", "10")]
    write_rows(tmp_path / "results.csv", rows)
    plain = study_table_of(tmp_path / "results.csv", draws=10)
    run_configs.write_configs(tmp_path, {("d", "fedsm", 0, "fedsm"): _record("fedsm", "fedsm", 30)})

    # Execute
    counted = study_table_of(tmp_path / "results.csv", draws=10)

    # Assert: the recorded 30 passes move FedSM's last point from round 10 to 40
    assert "| FedSM | 10 | 3.33 | 3.33 | 0 of 1 seeds |" in plain and "fine-tuning" not in plain
    assert "| FedSM | 40 | 13.33 | 13.33 | 0 of 1 seeds |" in counted
    assert "the 30 local passes of its final fine-tuning" in counted
