"""Run outputs: pooling per-site metrics (per image and per case), the metrics CSV and the summary tables."""

from __future__ import annotations

import csv

import pytest

from fedsm_core.run_files.run_outputs import MetricsLog, format_table, pool_site_metrics, write_summary

PER_SITE = {
    "a": {"dice-global": 0.5, "num-images": 1.0},
    "b": {"dice-global": 0.9, "dice-personal": 0.7, "num-images": 3.0},
}


def test_pooled_values_are_image_weighted_means():
    pooled = pool_site_metrics(PER_SITE)
    # dice-global: (1 * 0.5 + 3 * 0.9) / 4 = 0.8;  dice-personal only at b: 0.7
    assert pooled["dice-global"] == pytest.approx(0.8)
    assert pooled["dice-personal"] == pytest.approx(0.7)
    assert pooled["num-images"] == 4.0


def test_metrics_log_writes_long_rows_with_pooled(tmp_path):
    log = MetricsLog(tmp_path / "metrics.csv")
    log.add(3, "val", PER_SITE)
    with (tmp_path / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {(r["round"], r["split"]) for r in rows} == {("3", "val")}
    pooled = {r["metric"]: float(r["value"]) for r in rows if r["site"] == "pooled"}
    assert pooled["dice-global"] == pytest.approx(0.8)


def test_a_second_evaluation_of_a_round_replaces_the_first_in_the_log_and_the_file(tmp_path):
    # Arrange: round 2's validation, then round 2's test
    log = MetricsLog(tmp_path / "metrics.csv")
    log.add(2, "val", PER_SITE)
    log.add(2, "test", PER_SITE)

    # Execute: round 2 validated again (FedSM after fine-tuning a stopped run), with other values
    log.add(2, "val", {"a": {"dice-global": 0.1, "num-images": 1.0}})

    # Assert: one validation of round 2 (the new one) in memory and on disk; the test rows kept
    with (tmp_path / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [tuple(map(str, row)) for row in log.rows] == [tuple(r.values()) for r in rows]
    val = {(r["site"], r["metric"]): float(r["value"]) for r in rows if r["split"] == "val"}
    assert val == {("a", "dice-global"): 0.1, ("a", "num-images"): 1.0, ("pooled", "dice-global"): 0.1,
                   ("pooled", "num-images"): 1.0}
    assert sum(r["split"] == "test" for r in rows) == 2 + 3 + 3  # a: 2 metrics, b: 3, pooled: 3


def test_table_shows_only_reported_metrics_and_dashes_for_missing_sites():
    lines = format_table(PER_SITE)
    assert lines[0] == "| site | images | dice-global | dice-personal |"
    assert lines[2] == "| a | 1 | 0.5000 | - |"
    assert lines[-1] == "| pooled | 4 | 0.8000 | 0.7000 |"


CASE_SITES = {
    # a: 3 cases, 1 with an empty target, 1 missed by the super model; b: 2 cases
    "a": {"dice-super": 0.8, "num-images": 30.0, "num-cases": 3.0, "num-empty-cases": 1.0,
          "case-dice-super": 0.6, "case-hd95-super": 4.0, "case-hd95-mm-super": 8.0, "num-missed-cases-super": 1.0},
    "b": {"dice-super": 0.9, "num-images": 10.0, "num-cases": 2.0, "case-dice-super": 0.9, "case-hd95-super": 1.0,
          "case-hd95-mm-super": 5.0, "num-missed-cases-super": 0.0},
}


def test_case_means_pool_over_the_cases_they_were_taken_over():
    pooled = pool_site_metrics(CASE_SITES)
    # case-dice-super over cases with foreground: (2 * 0.6 + 2 * 0.9) / 4 = 0.75
    # case-hd95-super over cases with a defined HD95: (1 * 4 + 2 * 1) / 3 = 2
    assert pooled["case-dice-super"] == pytest.approx(0.75)
    assert pooled["case-hd95-super"] == pytest.approx(2.0)
    assert pooled["case-hd95-mm-super"] == pytest.approx((1 * 8.0 + 2 * 5.0) / 3)  # over the same cases
    assert (pooled["num-cases"], pooled["num-empty-cases"], pooled["num-missed-cases-super"]) == (5.0, 1.0, 1.0)
    assert pooled["dice-super"] == pytest.approx((30 * 0.8 + 10 * 0.9) / 40)


def test_the_summary_labels_slice_and_case_dice_only_where_cases_exist(tmp_path):
    with_cases = write_summary(tmp_path / "cases.md", "run", {}, [("Test", CASE_SITES)]).read_text()
    without = write_summary(tmp_path / "fundus.md", "run", {}, [("Test", PER_SITE)]).read_text()
    assert "| site | images | dice-super | num-cases | case-dice-super | case-hd95-super |" in with_cases
    assert "slice Dice (paper)" in with_cases and "per-case 3-D Dice" in with_cases
    assert "case" not in without
