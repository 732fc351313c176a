"""A whole in-process run with a simulated malicious site: the mean is wrecked, the robust aggregations are not.

Four FedAvg rounds on tiny generated sites, through the real ServerApp and
ClientApp handlers (``tests/support/in_process_grid.py``). site-6 sends its
update reversed and scaled by 4 (``sign-flip``).
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from support.in_process_grid import TINY

from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, load_checkpoint

pytestmark = pytest.mark.long_module(seconds=60)

RUN = "num-server-rounds=4 max-local-steps=2 image-size=32 data-scale=0.1 eval-every=4 strategy='fedavg'"
ATTACK = "attack='site-6:sign-flip' attack-scale=4.0"


def _honest_test_dice(rows) -> float:
    """Client average of the test Dice over the five honest sites."""
    return statistics.mean(float(r["value"]) for r in rows if r["split"] == "test" and r["metric"] == "dice-global"
                           and r["site"].startswith("site-") and r["site"] != "site-6")


def test_a_sign_flipping_site_wrecks_the_mean_but_not_the_trimmed_mean_nor_the_default(in_process_app):
    # Execute: the same run without attack, attacked under the mean, the trimmed mean and the default (filtered mean)
    _, clean, _ = in_process_app(f"{RUN} aggregation='mean'", name="clean")
    _, wrecked, _ = in_process_app(f"{RUN} {ATTACK} aggregation='mean'", name="mean")
    folder, trimmed, _ = in_process_app(f"{RUN} {ATTACK} aggregation='trimmed-mean'", name="trimmed")
    _, default, _ = in_process_app(f"{RUN} {ATTACK}", name="default")

    # Assert: under the mean the honest sites lose most of what they learned; the robust ones keep most of it
    base = _honest_test_dice(clean)
    assert _honest_test_dice(wrecked) < 0.25 * base
    assert _honest_test_dice(trimmed) > 0.5 * base
    assert _honest_test_dice(default) > 0.5 * base
    summary = (folder / "summary.md").read_text()
    assert "simulated attack: site-6 is malicious (sign-flip, attack-scale 4); aggregation = trimmed-mean" in summary


def test_fedsm_attacks_reach_every_personalized_model_and_fake_statistics_are_refused(tiny_fedsm, in_process_app):
    # Execute: the session's one-round tiny FedSM run again, with site-6 poisoning its personalized model and
    # site-5 reporting site-6's selector statistics as its own
    one_round = TINY.replace("num-server-rounds=2", "num-server-rounds=1")
    folder, _, grid = in_process_app(f"{one_round} attack='site-6:poison-personalized,site-5:fake-statistics'")

    # Assert: SoftPull carried site-6's poison into site-1's model; site-5's statistics fail the count check
    attacked = load_checkpoint(folder / CHECKPOINT_FILE)["state"]["personalized"]["site-1"]
    clean = load_checkpoint(tiny_fedsm.first / CHECKPOINT_FILE)["state"]["personalized"]["site-1"]
    assert any(not np.array_equal(attacked[key], clean[key]) for key in clean)
    assert any("selector statistics of site-5 rejected" in line and "expected" in line for line in grid.log)
    summary = (folder / "summary.md").read_text()
    assert "site-6 is malicious (poison-personalized" in summary and "site-5 is malicious (fake-statistics" in summary
