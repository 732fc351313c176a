"""The route-by study: cells written once and skipped after, and the table's client averages."""

from __future__ import annotations

import csv

import pytest

from experiments.routing import run_route_by
from experiments.routing.route_by_table import COLUMNS, client_averages, table_lines

pytestmark = pytest.mark.long_module(seconds=20)

TINY = "image-size=32 data-scale=0.1 max-local-steps=1 selector-width=4"


def test_a_study_writes_a_cell_once_with_case_scores_and_a_second_sitting_trains_nothing(tmp_path, monkeypatch):
    # Prepare
    monkeypatch.setenv("FEDSM_SITE_STATE", str(tmp_path / "site-state"))
    args = ["--out", str(tmp_path / "study"), "--routes", "case", "--rounds", "1", "--run-config", TINY]

    # Execute
    assert run_route_by.main(args) == 0
    monkeypatch.setattr(run_route_by, "run_cell", lambda *a: pytest.fail("a finished cell was trained again"))
    assert run_route_by.main(args) == 0

    # Assert: the cell of synthetic-prostate (its default dataset) with the six sites' validation and test
    # scores, per-case 3-D Dice among them (the generated prostate ids name cases)
    with (tmp_path / "study" / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {(r["dataset"], r["route_by"]) for r in rows} == {("synthetic-prostate", "case")}
    assert len([r for r in rows if r["split"] == "test" and r["metric"] == "case-dice-super"]) == 6
    assert any(r["split"] == "val" and r["metric"] == "dice-super" for r in rows)
    assert "| case |" in (tmp_path / "study" / "table.md").read_text()


def test_a_cell_runs_fedsm_with_its_routing_and_seed():
    values = run_route_by.cell_overrides(("synthetic-prostate", "case", 2), 30, {"image-size": 64})
    assert (values["strategy"], values["route-by"], values["seed"], values["data-seed"]) == ("fedsm", "case", 2, 2)
    assert (values["num-server-rounds"], values["eval-every"], values["image-size"]) == (30, 30, 64)


def test_the_table_averages_sites_then_seeds_and_leaves_out_undefined_values(tmp_path):
    # Prepare: seed 0 sites 0.6 / 0.8 (mean 0.7), seed 1 sites 0.9 / NaN (mean 0.9): average 0.8
    path = tmp_path / "results.csv"
    rows = [("d", "case", 0, "test", "a", "case-hd95-super", 0.6),
            ("d", "case", 0, "test", "b", "case-hd95-super", 0.8),
            ("d", "case", 1, "test", "a", "case-hd95-super", 0.9),
            ("d", "case", 1, "test", "b", "case-hd95-super", float("nan")),
            ("d", "case", 0, "time", "", "seconds", 5.0)]
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([COLUMNS, *rows])

    # Execute
    averages = client_averages(path)
    lines = table_lines(path)

    # Assert
    assert averages[("d", "case", "test", "case-hd95-super")] == pytest.approx(0.8)
    assert ("d", "case", "time", "seconds") not in averages
    assert "| case | 0 1 | - | - | - | 0.8000 | - |" in lines
