"""Re-scoring the ladder's FedSM checkpoints: each gamma rule's choices, kNN-Per on the routed model, agreement."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from experiments.ladder import final_fine_tuning, gamma_rules, routed_knn
from experiments.ladder import run_ladder as ladder
from experiments.runner import parse_overrides
from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.algorithms.knn_per.settings import LAMBDA_GRID
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.cross_fit import halve_by_case

TINY_TEXT = "image-size=32 data-scale=0.1 max-local-steps=2 selector-width=4 batch-size=4 eval-every=1"


def _site(best_at_zero: float, at_one: float, images: float) -> dict[str, object]:
    return {"dice-super-sweep": [best_at_zero] * (len(GAMMA_GRID) - 1) + [at_one], "num-images": images}


def test_each_rule_gives_each_site_the_gamma_it_is_named_for():
    # a large site best at gamma 0, a small one best at gamma 1
    validation = {"large": _site(0.9, 0.8, 50.0), "small": _site(0.6, 0.7, 5.0)}
    assert gamma_rules.site_gammas("per-site", validation) == {"large": 0.0, "small": 1.0}
    # pooled by images: gamma 0 (45 + 3) / 55 = 0.8727 beats gamma 1 (40 + 3.5) / 55 = 0.7909
    assert gamma_rules.site_gammas("validation", validation) == {"large": 0.0, "small": 0.0}
    assert gamma_rules.site_gammas("global", validation) == {"large": 1.0, "small": 1.0}
    assert gamma_rules.site_gammas("selector", validation) == {"large": 0.0, "small": 0.0}
    validation["small"] = _site(0.5, 0.7, 5.0)  # client average: gamma 1 (0.75) beats gamma 0 (0.70)
    assert gamma_rules.site_gammas("client-average", validation) == {"large": 1.0, "small": 1.0}


def test_the_halves_of_a_split_take_every_image_once():
    data = SegArrays(np.zeros((5, 3, 4, 4), np.float32), np.zeros((5, 1, 4, 4), np.float32),
                     tuple(f"img{i}" for i in range(5)))
    first, second = halve_by_case(data)
    assert first.ids == ("img0", "img2", "img4") and second.ids == ("img1", "img3")


def _rows(path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def trained_cell(tmp_path_factory):
    """A one-round FedSM cell on the real sites (the ladder's own rows, without its centralized cell)."""
    out = tmp_path_factory.mktemp("ladder")
    cell = ("synthetic-fundus", "fedsm", "real", 0)
    ladder.run_one(cell, parse_overrides(TINY_TEXT), 1, ladder.cell_folder(out, cell), out / "results.csv")
    return out


def _common(out) -> list[str]:
    return ["--out", str(out), "--datasets", "synthetic-fundus", "--rounds", "1", "--run-config", TINY_TEXT]


@pytest.mark.long_module(seconds=40)
def test_rescored_rules_agree_with_the_ladders_own_scores_of_the_same_checkpoint(trained_cell):
    # Execute
    assert gamma_rules.main(_common(trained_cell)) == 0

    # Assert: gamma 1 is the global model and the ladder's own rule (validation) is its super model, site by site
    ladder_rows = [r for r in _rows(trained_cell / "results.csv") if r["method"] == "fedsm"]
    rescored = _rows(trained_cell / "gamma_rules.csv")
    tests = [r for r in rescored if r["split"] == gamma_rules.TEST]
    assert {r["rule"] for r in tests} == set(gamma_rules.RULES) and len(tests) == 6 * len(gamma_rules.RULES)
    for rule, kind in (("global", "test"), ("validation", "test-super")):
        expected = {r["site"]: float(r["value"]) for r in ladder_rows if r["kind"] == kind and r["site"] != "pooled"}
        got = {r["site"]: float(r["dice"]) for r in tests if r["rule"] == rule}
        assert got == pytest.approx(expected, abs=2e-6), rule
    # the 2-fold estimate covers every rule for the sites with two or more validation images
    folds = [r for r in rescored if r["split"] == gamma_rules.FOLDS]
    assert {r["rule"] for r in folds} == set(gamma_rules.RULES) and len(folds) % len(gamma_rules.RULES) == 0
    assert "## synthetic-fundus, fedsm" in (trained_cell / "gamma_rules.md").read_text()


def test_routed_knn_without_its_mix_is_the_super_model_each_rule_scores(trained_cell):
    # Execute
    assert routed_knn.main(_common(trained_cell)) == 0
    assert gamma_rules.main(_common(trained_cell)) == 0  # a no-op when the test above ran first

    # Assert: at lam = 0 each rule's routed kNN-Per scores what gamma_rules scores for that rule, site by site
    rows = _rows(trained_cell / "routed_knn.csv")
    assert len(rows) == 6 * len(routed_knn.RULES)
    rescored = [r for r in _rows(trained_cell / "gamma_rules.csv") if r["split"] == gamma_rules.TEST]
    for rule in routed_knn.RULES:
        expected = {r["site"]: float(r["dice"]) for r in rescored if r["rule"] == rule}
        got = {r["site"]: float(r["dice-super"]) for r in rows if r["rule"] == rule}
        assert got == pytest.approx(expected, abs=2e-6), rule
        assert {r["gamma"] for r in rows if r["rule"] == rule} == {r["gamma"] for r in rescored if r["rule"] == rule}
    assert all(float(r["knn-lambda"]) in LAMBDA_GRID for r in rows)
    assert "## synthetic-fundus, fedsm" in (trained_cell / "routed_knn.md").read_text()


def test_final_fine_tuning_rescores_softpulls_models_as_gamma_rules_does_and_then_the_fine_tuned_ones(trained_cell):
    # Execute
    assert final_fine_tuning.main([*_common(trained_cell), "--max-passes", "2"]) == 0
    assert gamma_rules.main(_common(trained_cell)) == 0  # a no-op when a test above ran first

    # Assert: with SoftPull's models each rule scores what gamma_rules scores; then every site's fine-tuned
    # model is scored under every rule, with the pass it kept
    rows = _rows(trained_cell / "final_fine_tuning.csv")
    assert len(rows) == 2 * 6 * len(final_fine_tuning.RULES)
    rescored = [r for r in _rows(trained_cell / "gamma_rules.csv") if r["split"] == gamma_rules.TEST]
    for rule in set(final_fine_tuning.RULES) - {"own"}:
        expected = {r["site"]: float(r["dice"]) for r in rescored if r["rule"] == rule}
        got = {r["site"]: float(r["dice"]) for r in rows if r["rule"] == rule and r["models"] == "softpull"}
        assert got == pytest.approx(expected, abs=2e-6), rule
    tuned = [r for r in rows if r["models"] == "fine-tuned"]
    assert {r["site"] for r in tuned if r["rule"] == "own"} == {f"site-{i}" for i in range(1, 7)}
    assert all(int(r["passes"]) in (0, 1, 2) for r in tuned)
    assert "| own |" in (trained_cell / "final_fine_tuning.md").read_text()


def test_final_fine_tuning_on_validation_scores_held_out_halves_as_gamma_rules_two_folds_do(trained_cell):
    # Execute
    assert final_fine_tuning.main([*_common(trained_cell), "--max-passes", "2", "--on-validation"]) == 0
    assert gamma_rules.main(_common(trained_cell)) == 0  # a no-op when a test above ran first

    # Assert: SoftPull's arm, averaged over the two folds, is gamma_rules' two-fold validation estimate;
    # the fine-tuned arm has one row per site, rule and fold, with the pass chosen on that fold's half
    rows = _rows(trained_cell / "final_fine_tuning_validation.csv")
    folds = [r for r in _rows(trained_cell / "gamma_rules.csv") if r["split"] == gamma_rules.FOLDS]
    for rule in set(final_fine_tuning.RULES) - {"own"}:
        expected = {r["site"]: float(r["dice"]) for r in folds if r["rule"] == rule}
        got = {site: np.mean([float(r["dice"]) for r in rows
                              if r["rule"] == rule and r["models"] == "softpull" and r["site"] == site])
               for site in expected}
        assert got == pytest.approx(expected, abs=2e-6), rule
    tuned = [r for r in rows if r["models"] == "fine-tuned" and r["rule"] == "own"]
    assert sorted((r["site"], r["fold"]) for r in tuned) == sorted(
        (site, fold) for site in {r["site"] for r in folds} for fold in ("1", "2"))
    assert all(int(r["passes"]) in (0, 1, 2) for r in tuned)
    assert "test split is not read" in (trained_cell / "final_fine_tuning_validation.md").read_text()
