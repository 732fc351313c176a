"""Re-scoring the ladder's FedSM checkpoints under each gamma rule: the rules' choices, agreement with the ladder."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from experiments.ladder import gamma_rules
from experiments.ladder import run_ladder as ladder
from experiments.runner import parse_overrides
from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.data.arrays import SegArrays

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
    first, second = gamma_rules.halves(data)
    assert first.ids == ("img0", "img2", "img4") and second.ids == ("img1", "img3")


def _rows(path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.long_module(seconds=30)
def test_rescored_rules_agree_with_the_ladders_own_scores_of_the_same_checkpoint(tmp_path):
    # Prepare: a one-round FedSM cell on the real sites (the ladder's own rows, without its centralized cell)
    cell = ("synthetic-fundus", "fedsm", "real", 0)
    ladder.run_one(cell, parse_overrides(TINY_TEXT), 1, ladder.cell_folder(tmp_path, cell), tmp_path / "results.csv")
    common = ["--out", str(tmp_path), "--datasets", "synthetic-fundus", "--rounds", "1", "--run-config", TINY_TEXT]

    # Execute
    assert gamma_rules.main(common) == 0

    # Assert: gamma 1 is the global model and the ladder's own rule (validation) is its super model, site by site
    ladder_rows = [r for r in _rows(tmp_path / "results.csv") if r["method"] == "fedsm"]
    rescored = _rows(tmp_path / "gamma_rules.csv")
    tests = [r for r in rescored if r["split"] == gamma_rules.TEST]
    assert {r["rule"] for r in tests} == set(gamma_rules.RULES) and len(tests) == 6 * len(gamma_rules.RULES)
    for rule, kind in (("global", "test"), ("validation", "test-super")):
        expected = {r["site"]: float(r["value"]) for r in ladder_rows if r["kind"] == kind and r["site"] != "pooled"}
        got = {r["site"]: float(r["dice"]) for r in tests if r["rule"] == rule}
        assert got == pytest.approx(expected, abs=2e-6), rule
    # the 2-fold estimate covers every rule for the sites with two or more validation images
    folds = [r for r in rescored if r["split"] == gamma_rules.FOLDS]
    assert {r["rule"] for r in folds} == set(gamma_rules.RULES) and len(folds) % len(gamma_rules.RULES) == 0
    assert "## synthetic-fundus, fedsm" in (tmp_path / "gamma_rules.md").read_text()
