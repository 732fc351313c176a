"""Gamma chosen on cross-fitted validation: merging halves, the reduction to the whole split, the three arms."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.ladder import cross_fit_gamma, gamma_rules, run_folders
from experiments.runner import read_rows
from fedsm_core.algorithms.fedsm.final_fine_tuning import FineTuned


def test_merging_two_halves_weights_dice_by_images_with_foreground_and_adds_counts():
    # first half: 4 images, 1 empty (3 with foreground); second: 2 images, 1 empty (1 with foreground)
    first = {"dice-super-sweep": [0.8, 0.6], "num-images": 4.0, "num-empty": 1.0,
             "routing-gain-sweep": [0.5, -0.25], "routed-count-sweep": [3.0, 1.0]}
    second = {"dice-super-sweep": [0.5, 0.9], "num-images": 2.0, "num-empty": 1.0,
              "routing-gain-sweep": [0.125, 0.0], "routed-count-sweep": [1.0, 0.0]}

    merged = cross_fit_gamma.merge_halves(first, second)

    # (3 * 0.8 + 1 * 0.5) / 4 = 0.725; (3 * 0.6 + 1 * 0.9) / 4 = 0.675
    assert merged["dice-super-sweep"] == pytest.approx([0.725, 0.675], abs=1e-12)
    assert merged["num-images"] == 6.0 and merged["num-empty"] == 2.0
    assert merged["routing-gain-sweep"] == pytest.approx([0.625, -0.25], abs=1e-12)
    assert merged["routed-count-sweep"] == [4.0, 1.0]


def test_halves_without_foreground_merge_to_zero_dice_not_nan():
    empty = {"dice-super-sweep": [0.0], "num-images": 2.0, "num-empty": 2.0}
    assert cross_fit_gamma.merge_halves(empty, empty)["dice-super-sweep"] == [0.0]


def test_cross_fitting_with_the_deployed_models_on_both_halves_is_the_whole_validation_sweep(tiny_fedsm):
    # Arrange: a finished FedSM run; each half's "chosen" model is the deployed one, so nothing is cross-fitted
    config, checkpoint = run_folders.read_run(tiny_fedsm.straight)
    federation = run_folders.load_run_folder(tiny_fedsm.straight, config, checkpoint)
    deployed = dict(federation.fedsm.personalized)
    same = {name: FineTuned(weights, 0, (0.0,)) for name, weights in deployed.items()}
    halves = {site.name: gamma_rules.halves(site.val) for site in federation.sites if len(site.val) >= 2}
    whole = gamma_rules.sweep(federation, {site.name: site.val for site in federation.sites})

    # Execute
    crossed = cross_fit_gamma.cross_fitted(federation, deployed, halves, (same, same), whole)

    # Assert: the two halves' sweeps merge back into the whole split's, site by site
    assert halves and set(crossed) == set(whole)
    for name in whole:
        for key in ("dice-super-sweep", "routing-gain-sweep", "routed-count-sweep", "num-images", "num-empty"):
            assert np.asarray(crossed[name][key], float) == pytest.approx(np.asarray(whole[name][key], float),
                                                                          abs=1e-6), (name, key)


def test_the_three_arms_are_scored_and_softpulls_is_the_runs_own(tiny_fedsm, tmp_path):
    # Execute
    assert cross_fit_gamma.main(["--out", str(tmp_path), "--run-folders", str(tiny_fedsm.straight),
                                 "--max-passes", "1"]) == 0

    # Assert: SoftPull's arm on test is the run's own super model; each arm has every rule and site; the validation
    # rows are the sweeps' Dice at the chosen gamma
    rows = read_rows(tmp_path / "cross_fit_gamma.csv")
    own = {r["site"]: float(r["value"]) for r in tiny_fedsm.straight_rows
           if r["split"] == "test" and r["metric"] == "dice-super" and r["site"] != "pooled"}
    softpull = {r["site"]: float(r["dice"]) for r in rows
                if (r["arm"], r["split"], r["rule"]) == ("softpull", "test", "client-average")}
    assert softpull == pytest.approx(own, abs=1e-5)
    for arm in cross_fit_gamma.ARMS:
        assert len([r for r in rows if r["arm"] == arm and r["split"] == "test"]) == 6 * len(gamma_rules.RULES)
        assert len([r for r in rows if r["arm"] == arm and r["split"] == "val"]) == 6 * (len(gamma_rules.RULES) - 1)
    assert all(int(r["passes"]) in (0, 1) for r in rows if r["arm"] != "softpull")
    text = (tmp_path / "cross_fit_gamma.md").read_text()
    assert "| client-average |" in text and "cross-fit test" in text
