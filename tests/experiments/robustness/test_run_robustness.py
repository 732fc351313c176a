"""The robustness study: cells written once and skipped after, and the table's honest-site arithmetic."""

from __future__ import annotations

import csv

import pytest

from experiments.robustness import run_robustness
from experiments.robustness.table import COLUMNS, change_points, honest_scores, write_table

pytestmark = pytest.mark.long_module(seconds=16)

TINY = "image-size=32 data-scale=0.1 max-local-steps=1 selector-width=4"


def test_a_study_writes_every_cell_once_and_a_second_sitting_trains_nothing(tmp_path, monkeypatch):
    # Prepare
    monkeypatch.setenv("FEDSM_SITE_STATE", str(tmp_path / "site-state"))
    args = ["--out", str(tmp_path / "study"), "--datasets", "synthetic-fundus", "--methods", "fedavg",
            "--attacks", "none", "sign-flip", "absent", "--aggregations", "median", "--rounds", "1",
            "--run-config", TINY]

    # Execute
    assert run_robustness.main(args) == 0
    monkeypatch.setattr(run_robustness, "run_cell", lambda *a: pytest.fail("a finished cell was trained again"))
    assert run_robustness.main(args) == 0

    # Assert: three cells, each with its sites' test Dice (the absent site's not: it never trained) and its
    # seconds per round; the table has them all
    with (tmp_path / "study" / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {(r["attack"], r["aggregation"]) for r in rows} == {("none", "median"), ("sign-flip", "median"),
                                                               ("absent", "median")}
    tested = {a: [r["site"] for r in rows if r["attack"] == a and r["kind"] == "test"] for a in ("none", "absent")}
    assert len(tested["none"]) == 6 and sorted(tested["absent"]) == sorted(set(tested["none"]) - {"site-6"})
    assert sum(r["kind"] == "test" for r in rows) == 6 + 6 + 5 and sum(r["kind"] != "test" for r in rows) == 3
    table = (tmp_path / "study" / "table.md").read_text()
    assert "| sign-flip |" in table and "| absent |" in table and (tmp_path / "study" / "plot.png").stat().st_size > 0
    assert (tmp_path / "study" / "commands.md").read_text().count("cells finished at the start") == 2


def test_a_clipped_aggregation_sets_the_clip_factor_and_a_plain_one_none():
    clipped = run_robustness.cell_overrides(("d.toml", "fedavg", "noise", "median+clip", 1), 30, "site-6", 4.0, {}, 2.5)
    plain = run_robustness.cell_overrides(("d.toml", "fedavg", "none", "mean", 1), 30, "site-6", 4.0, {}, 2.5)
    assert (clipped["aggregation"], clipped["clip-update-norm"], clipped["attack"]) == ("median", 2.5, "site-6:noise")
    assert (plain["aggregation"], plain["clip-update-norm"], plain["attack"]) == ("mean", 0.0, "")


def test_the_directed_filtered_mean_sets_the_least_cosine_and_the_others_leave_it_off():
    directed = run_robustness.cell_overrides(("d.toml", "fedavg", "label-flip", "filtered-mean+cosine", 1), 30,
                                             "site-6", 4.0, {}, 2.5, 0.25)
    plain = run_robustness.cell_overrides(("d.toml", "fedavg", "label-flip", "filtered-mean", 1), 30, "site-6", 4.0,
                                          {}, 2.5, 0.25)
    assert (directed["aggregation"], directed["filter-min-cosine"]) == ("filtered-mean", 0.25)
    assert (plain["aggregation"], plain["filter-min-cosine"]) == ("filtered-mean", -1.0)


def test_the_remembering_filtered_mean_turns_the_memory_on_and_the_others_leave_it_off():
    remembering = run_robustness.cell_overrides(("d.toml", "fedavg", "label-flip", "filtered-mean+memory", 1), 30,
                                                "site-6", 4.0, {})
    directed = run_robustness.cell_overrides(("d.toml", "fedavg", "label-flip", "filtered-mean+cosine", 1), 30,
                                             "site-6", 4.0, {})
    assert (remembering["aggregation"], remembering["filter-memory"], remembering["filter-min-cosine"]) == (
        "filtered-mean", True, -1.0)
    assert (directed["aggregation"], directed["filter-memory"]) == ("filtered-mean", False)


def test_an_absent_site_is_held_out_of_the_run_and_attacks_nothing():
    absent = run_robustness.cell_overrides(("d.toml", "fedavg", "absent", "mean", 1), 30, "site-3", 4.0, {})
    clean = run_robustness.cell_overrides(("d.toml", "fedavg", "none", "mean", 1), 30, "site-3", 4.0, {})
    attacked = run_robustness.cell_overrides(("d.toml", "fedavg", "sign-flip", "mean", 1), 30, "site-3", 4.0, {})
    assert (absent["held-out-site"], absent["attack"]) == ("site-3", "")
    assert "held-out-site" not in clean and "held-out-site" not in attacked  # the other cells' configs stay as recorded
    assert attacked["attack"] == "site-3:sign-flip"


def test_fedsm_only_attacks_are_planned_for_fedsm_alone():
    planned = run_robustness.cells(["d"], ["fedavg", "fedsm"], ["none", "poison-personalized"], ["mean"], [0])
    assert planned == [("d", "fedavg", "none", "mean", 0), ("d", "fedsm", "none", "mean", 0),
                       ("d", "fedsm", "poison-personalized", "mean", 0)]


def test_the_table_averages_the_honest_sites_only_and_reports_points_against_the_clean_mean(tmp_path):
    # Prepare: site-6 attacks; honest sites a, b score 0.8 / 0.9 clean, 0.4 / 0.5 attacked under the mean
    path = tmp_path / "results.csv"
    rows = [("d", "fedavg", attack, "mean", 0, "test", site, value)
            for attack, values in (("none", (0.8, 0.9, 0.1)), ("sign-flip", (0.4, 0.5, 0.0)))
            for site, value in zip(("site-1", "site-2", "site-6"), values, strict=True)]
    rows += [("d", "fedavg", attack, "mean", 0, "seconds-per-round", "", 2.0) for attack in ("none", "sign-flip")]
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([COLUMNS, *rows])

    # Execute
    dice, _ = honest_scores(path, "site-6")
    table = write_table(path, tmp_path / "table.md").read_text()

    # Assert: (0.8 + 0.9) / 2 = 0.85 clean, 0.45 attacked: -40 points
    assert dice[("d", "fedavg", "none", "mean")] == {0: pytest.approx(0.85)}
    assert "| sign-flip | 0.4500 (-40.0) |" in table


def test_the_cost_without_attack_is_also_given_over_every_site(tmp_path):
    # Prepare: without attack the filtered mean keeps sites 1-2 as the mean (0.8 / 0.9) but costs site-6 0.3
    path = tmp_path / "results.csv"
    rows = [("d", "fedavg", "none", aggregation, 0, "test", site, value)
            for aggregation, values in (("mean", (0.8, 0.9, 0.7)), ("filtered-mean", (0.8, 0.9, 0.4)))
            for site, value in zip(("site-1", "site-2", "site-6"), values, strict=True)]
    rows += [("d", "fedavg", "none", g, 0, "seconds-per-round", "", 2.0) for g in ("mean", "filtered-mean")]
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([COLUMNS, *rows])

    # Execute
    table = write_table(path, tmp_path / "table.md").read_text()

    # Assert: the honest sites' change is 0; over the three sites (0.8 + 0.9 + 0.4) / 3 - 0.8 = -10 points
    assert "| filtered-mean | +0.00 | -10.00 | 2.0 | 1.00x |" in table


def test_a_change_is_measured_on_the_seeds_the_cell_shares_with_the_clean_run():
    # the clean run has seeds 0 (0.90) and 1 (0.80); the attacked cell only seed 0 (0.88): -2 points, not +3
    assert change_points({0: 0.88}, {0: 0.90, 1: 0.80}) == pytest.approx(-2.0)
    assert change_points({0: 0.88, 1: 0.70}, {0: 0.90, 1: 0.80}) == pytest.approx(-6.0)
    assert change_points({2: 0.88}, {0: 0.90}) is None
