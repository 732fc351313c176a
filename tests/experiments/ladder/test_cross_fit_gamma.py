"""The cross-fit re-scorer: SoftPull's, the fine-tuned and the cross-fitted arms of one finished run."""

from __future__ import annotations

import pytest

from experiments.ladder import cross_fit_gamma, gamma_rules
from experiments.runner import read_rows


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
