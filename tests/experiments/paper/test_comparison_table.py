"""The comparison table and curves from a tiny long-format CSV."""

from __future__ import annotations

from experiments.paper.comparison_table import best_so_far, comparison_table, plot_curves, read_long_csv, write_long_csv


def _rows():
    rows = []
    # FedAvg, 2 seeds: site-a 0.5 / 0.7, site-b 0.9 / 0.9, pooled 0.8 / 0.8
    for seed, a in (("0", 0.5), ("1", 0.7)):
        rows += [
            {"method": "FedAvg", "seed": seed, "site": "site-a", "metric": "dice", "value": a},
            {"method": "FedAvg", "seed": seed, "site": "site-b", "metric": "dice", "value": 0.9},
            {"method": "FedAvg", "seed": seed, "site": "pooled", "metric": "dice", "value": 0.8},
        ]
    # Local-1, one seed, no pooled value; a row of another metric is ignored
    rows += [
        {"method": "Local-1", "seed": "0", "site": "site-a", "metric": "dice", "value": 0.6},
        {"method": "Local-1", "seed": "0", "site": "site-b", "metric": "dice", "value": 0.2},
        {"method": "Local-1", "seed": "0", "site": "site-a", "metric": "loss", "value": 9.0},
    ]
    return rows


def test_table_rows_columns_and_mean_std(tmp_path):
    # Prepare
    path = write_long_csv(tmp_path / "results.csv", _rows())

    # Execute
    lines = comparison_table(read_long_csv(path), ["site-a", "site-b"])

    # Assert
    assert lines[0] == "| method | site-a | site-b | client avg | pooled |"
    # site-a: mean 0.6, sample std sqrt(((0.5-0.6)^2 + (0.7-0.6)^2) / 1) = 0.1414
    # client avg per seed: 0.7 and 0.8 -> mean 0.75, std 0.0707
    assert lines[2] == "| FedAvg | 0.6000 ± 0.1414 | 0.9000 ± 0.0000 | 0.7500 ± 0.0707 | 0.8000 ± 0.0000 |"
    # Local-1: one seed, no std; client avg (0.6 + 0.2) / 2 = 0.4; no pooled value
    assert lines[3] == "| Local-1 | 0.6000 | 0.2000 | 0.4000 | - |"
    assert len(lines) == 4


def test_best_so_far_is_a_running_maximum():
    assert best_so_far([(2, 0.5), (1, 0.6), (3, 0.7)]) == [(1, 0.6), (2, 0.6), (3, 0.7)]


def test_curves_are_written_as_png(tmp_path):
    path = plot_curves(tmp_path / "curves.png", {"FedAvg": [(1, 0.2), (2, 0.4)]}, ("Centralized", 0.5))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
