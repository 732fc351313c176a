"""Run outputs: pooling per-site metrics, the metrics CSV and the summary tables."""

from __future__ import annotations

import csv

import pytest

from fedsm_core.run_files.run_outputs import MetricsLog, format_table, pool_site_metrics

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


def test_table_shows_only_reported_metrics_and_dashes_for_missing_sites():
    lines = format_table(PER_SITE)
    assert lines[0] == "| site | images | dice-global | dice-personal |"
    assert lines[2] == "| a | 1 | 0.5000 | - |"
    assert lines[-1] == "| pooled | 4 | 0.8000 | 0.7000 |"
