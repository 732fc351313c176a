"""A whole in-process run with a simulated malicious site: the mean is wrecked, the trimmed mean is not.

Four FedAvg rounds on tiny generated sites, through the real ServerApp and
ClientApp handlers (``tests/support/in_process_grid.py``). site-6 sends its
update reversed and scaled by 4 (``sign-flip``).
"""

from __future__ import annotations

import statistics

RUN = "num-server-rounds=4 max-local-steps=2 image-size=32 data-scale=0.1 eval-every=4 strategy='fedavg'"
ATTACK = "attack='site-6:sign-flip' attack-scale=4.0"


def _honest_test_dice(rows) -> float:
    """Client average of the test Dice over the five honest sites."""
    return statistics.mean(float(r["value"]) for r in rows if r["split"] == "test" and r["metric"] == "dice-global"
                           and r["site"].startswith("site-") and r["site"] != "site-6")


def test_a_sign_flipping_site_wrecks_the_mean_but_not_the_trimmed_mean(in_process_app):
    # Execute: the same run without attack, attacked under the mean, attacked under the trimmed mean
    _, clean, _ = in_process_app(RUN, name="clean")
    _, wrecked, _ = in_process_app(f"{RUN} {ATTACK}", name="mean")
    folder, trimmed, _ = in_process_app(f"{RUN} {ATTACK} aggregation='trimmed-mean'", name="trimmed")

    # Assert: under the mean the honest sites lose most of what they learned; the trimmed mean keeps most of it
    base = _honest_test_dice(clean)
    assert _honest_test_dice(wrecked) < 0.25 * base
    assert _honest_test_dice(trimmed) > 0.5 * base
    summary = (folder / "summary.md").read_text()
    assert "simulated attack: site-6 is malicious (sign-flip, attack-scale 4); aggregation = trimmed-mean" in summary
