"""Per-case (3-D) scores in a study: the reported model's, from federated and centralized runs, and their table."""

from __future__ import annotations

import csv

import pytest

import experiments.study.run_plan as study
from experiments.study.runs import CASE_KINDS, RunKey, case_scores, federated_rows
from experiments.study.table import cases_table, study_table
from fedsm_core.run_files.run_outputs import CSV_COLUMNS

KEY = RunKey("synthetic-prostate", "fedsm", 0, "abc")


def test_case_scores_are_the_reported_models_and_absent_for_two_d_images():
    # Prepare: FedSM reports its super model; the global model's case scores must not be taken for it
    test = {("site-1", "dice-super"): 0.8, ("site-1", "case-dice-super"): 0.85, ("site-1", "case-hd95-super"): 2.0,
            ("site-1", "case-hd95-mm-super"): 5.0, ("site-1", "case-dice-global"): 0.1,
            ("pooled", "case-dice-super"): 0.84}

    # Execute
    found = case_scores(test, "dice-super")

    # Assert
    assert sorted(found) == [("case-dice", "pooled", 0.84), ("case-dice", "site-1", 0.85),
                             ("case-hd95", "site-1", 2.0), ("case-hd95-mm", "site-1", 5.0)]
    assert case_scores({("site-1", "dice-global"): 0.8}, "dice-global") == []


def test_a_federated_runs_rows_carry_its_case_scores_beside_its_slice_dice(tmp_path):
    # Prepare: a finished run folder's metrics.csv
    metrics = [(3, "val", "pooled", "dice-super", 0.7), (3, "test", "site-1", "dice-super", 0.8),
               (3, "test", "site-1", "case-dice-super", 0.85), (3, "test", "site-1", "case-hd95-super", 2.0),
               (3, "test", "pooled", "dice-super", 0.8), (3, "test", "pooled", "case-dice-super", 0.85)]
    with (tmp_path / "metrics.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([CSV_COLUMNS, *metrics])

    # Execute
    rows = federated_rows(KEY, tmp_path, [], 10.0)

    # Assert
    by_kind = {(r["kind"], r["site"]): r["value"] for r in rows}
    assert by_kind[("test", "site-1")] == 0.8
    assert by_kind[("case-dice", "site-1")] == 0.85 and by_kind[("case-dice", "pooled")] == 0.85
    assert by_kind[("case-hd95", "site-1")] == 2.0
    assert ("case-hd95-mm", "site-1") not in by_kind  # the run had no spacing: no row, not a zero


@pytest.mark.usefixtures("client_process")
@pytest.mark.parametrize(("dataset", "expect_cases"), [("synthetic-prostate", True), ("synthetic-fundus", False)])
def test_centralized_training_reports_case_scores_where_the_test_images_are_cases(dataset, expect_cases):
    # Prepare: one pass on tiny sites
    settings = {"dataset": dataset, "image-size": 32, "data-scale": 0.05, "eval-every": 1}
    key = RunKey(dataset, "centralized", 0, "abc")

    # Execute
    rows = study.run_centralized(key, settings, 1)

    # Assert: every site and the pooled cases, each kind once, Dice within [0, 1]
    case_rows = [r for r in rows if r["kind"] in CASE_KINDS]
    if not expect_cases:
        assert case_rows == []
        return
    sites = {r["site"] for r in rows if r["kind"] == "test"}
    for kind in CASE_KINDS:
        assert {r["site"] for r in case_rows if r["kind"] == kind} == sites, kind
    assert all(0.0 <= r["value"] <= 1.0 for r in case_rows if r["kind"] == "case-dice")


def _rows(method: str, seed: str, kind: str, values: dict[str, float]) -> list[dict[str, str]]:
    return [{"dataset": "d", "method": method, "seed": seed, "run": "x", "kind": kind, "round": "60", "site": site,
             "image": "", "value": str(value)} for site, value in values.items()]


def test_the_cases_table_puts_slice_dice_beside_the_per_case_scores():
    # Seed 0: slice 0.8 (0.7, 0.9), case 0.85 (0.8, 0.9), HD95 2 (1, 3) voxels, 5 mm (4, 6)
    # Seed 1: slice 0.9, case 0.95, HD95 1 voxel, 3 mm; the pooled rows stay out of the client average
    rows = [*_rows("fedavg", "0", "test", {"site-1": 0.7, "site-2": 0.9, "pooled": 0.1}),
            *_rows("fedavg", "0", "case-dice", {"site-1": 0.8, "site-2": 0.9, "pooled": 0.1}),
            *_rows("fedavg", "0", "case-hd95", {"site-1": 1.0, "site-2": 3.0}),
            *_rows("fedavg", "0", "case-hd95-mm", {"site-1": 4.0, "site-2": 6.0}),
            *_rows("fedavg", "1", "test", {"site-1": 0.9, "site-2": 0.9}),
            *_rows("fedavg", "1", "case-dice", {"site-1": 0.95, "site-2": 0.95}),
            *_rows("fedavg", "1", "case-hd95", {"site-1": 1.0, "site-2": 1.0}),
            *_rows("fedavg", "1", "case-hd95-mm", {"site-1": 3.0, "site-2": 3.0}),
            *_rows("fedbn", "0", "test", {"site-1": 0.5}), *_rows("fedbn", "0", "case-dice", {"site-1": 0.6})]

    lines = cases_table(rows, "d")

    # mean +- sample std over two seeds: slice 0.85 +- 0.0707, case 0.9 +- 0.0707, HD95 1.5 +- 0.7071,
    # mm 4 +- 1.4142; FedBN has no HD95 rows: "-"
    assert lines[-2] == "| FedAvg | 0.8500 ± 0.0707 | 0.9000 ± 0.0707 | 1.5000 ± 0.7071 | 4.0000 ± 1.4142 | 2 |"
    assert lines[-1] == "| FedBN | 0.5000 | 0.6000 | - | - | 1 |"
    two_d = [r for r in rows if r["kind"] == "test"]
    assert cases_table(two_d, "d") == []
    assert "Per case" in study_table(rows, 10) and "Per case" not in study_table(two_d, 10)

