"""The personalization study's variants, rows and report."""

from __future__ import annotations

import pytest

from experiments.paper.personalization_study import read_test_scores, variants, write_report
from fedsm_core.algorithms.personalization.settings import PERSONALIZATIONS
from fedsm_core.config import RunConfig


def test_table_6_has_one_valid_fedsm_run_per_personalization_method():
    chosen = variants(6)
    assert [v["personalization"] for v in chosen.values()] == list(PERSONALIZATIONS)
    for extra in chosen.values():
        assert RunConfig.from_mapping(extra).strategy == "fedsm"


def test_table_7_varies_only_the_softpull_lambda():
    chosen = variants(7, (0.3, 0.9))
    assert list(chosen) == ["lambda = 0.3", "lambda = 0.9"]
    assert [v["softpull-lambda"] for v in chosen.values()] == [0.3, 0.9]
    with pytest.raises(ValueError, match="--table 5"):
        variants(5)


def test_rows_keep_the_test_scores_of_both_models_only(tmp_path):
    # Prepare
    (tmp_path / "metrics.csv").write_text(
        "round,split,site,metric,value\n"
        "10,val,site-1,dice-super,0.5\n"
        "10,test,site-1,dice-super,0.8\n"
        "10,test,site-1,dice-personal,0.85\n"
        "10,test,pooled,dice-super,0.7\n"
        "10,test,site-1,dice-global,0.6\n")

    # Execute
    rows = read_test_scores(tmp_path, "FT", 0, {"personalization": "ft"})

    # Assert
    assert [(r["site"], r["metric"], r["value"]) for r in rows] == [
        ("site-1", "dice-super", 0.8), ("site-1", "dice-personal", 0.85), ("pooled", "dice-super", 0.7)]


def test_the_report_has_a_table_per_score_and_the_wall_times(tmp_path):
    rows = [{"method": "FT", "seed": 0, "site": site, "metric": metric, "value": value, "config": "{}"}
            for site, metric, value in [("a", "dice-super", 0.5), ("b", "dice-super", 0.7),
                                        ("pooled", "dice-super", 0.6),
                                        ("a", "dice-personal", 0.9), ("b", "dice-personal", 0.8)]]
    text = write_report(tmp_path / "table.md", 6, rows, ["a", "b"], {"FT": 12.0}, "Table 6")
    assert "| FT | 0.5000 | 0.7000 | 0.6000 | 0.6000 |" in text
    assert "| FT | 0.9000 | 0.8000 | 0.8500 | - |" in text
    assert "FT 12 s" in text and (tmp_path / "table.md").read_text() == text
