"""Smoke tests through the real transport: the README's run script (``flwr run .``, a local SuperLink, Ray).

Every strategy, resume and failure path runs in-process (``tests/server_app/test_app_runs.py``);
these two check that ``flwr run`` carries the same app to the same numbers (resumed, on two
SuperNodes serving six sites), and that a run failing inside the simulation exits non-zero.
"""

from __future__ import annotations

import pytest
import torch
from support.flwr_run import finished_run, run_simulation, superlinks
from support.in_process_grid import TINY

from fedsm_core.algorithms.fedsm.gamma import describe_gamma
from fedsm_core.run_files.bundle import load_bundle
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE

pytestmark = pytest.mark.long_module(seconds=90)

SELECTOR_ACCURACY_FLOOR = 0.9  # what a fitted head reaches on the tiny generated sites; chance is 1/6
# Pooled test Dice of the super model after the two tiny rounds: the untrained U-Net scores 0.088 on these
# images, the two rounds reach 0.147 with these seeds.
DICE_FLOOR = 0.12


# First in the module: it needs no tiny_fedsm runs, so under pytest-xdist it runs while another worker trains them
# (tests/server_app/test_app_runs.py starts at the same time) instead of this worker waiting for them.
def test_a_run_that_fails_inside_flwr_exits_non_zero_with_the_servers_error(tmp_path):
    # Arrange: a checkpoint file that exists (the settings check passes) but is not a checkpoint, so the
    # ServerApp fails inside the running flwr simulation
    broken = tmp_path / "checkpoint.pt"
    broken.write_bytes(b"not a checkpoint")

    # Execute
    result = run_simulation(tmp_path / "flwr", f"num-server-rounds=1 resume-from='{broken}'")

    # Assert: flwr run --stream exits 0 on a failed run; the script reads the run's real status
    assert result.returncode != 0
    assert "finished:failed" in result.stdout + result.stderr
    assert str(broken) in result.stdout + result.stderr
    assert superlinks(tmp_path / "flwr") == ""


def test_a_run_resumed_through_flwr_on_two_supernodes_gives_the_uninterrupted_in_process_numbers(tmp_path,
                                                                                                tiny_fedsm):
    # Arrange: round 1 ran in-process and stopped there (tiny_fedsm.first); round 2 goes through flwr run on
    # two simulated SuperNodes, so each serves three sites and finds their state from round 1

    # Execute
    result = run_simulation(tmp_path / "flwr", f"{TINY} resume-from='{tiny_fedsm.first / CHECKPOINT_FILE}'",
                            NUM_SUPERNODES="2", FEDSM_SITE_STATE=str(tiny_fedsm.site_state(tmp_path)))

    # Assert: Flower's transport carries the same app to the same numbers as six in-process nodes, row for row
    folder, rows = finished_run(tmp_path / "flwr", result)
    assert rows == tiny_fedsm.straight_rows
    assert {r["site"] for r in rows if r["split"] == "test"} == {f"site-{i}" for i in range(1, 7)} | {"pooled"}
    # It learned, not just ran: the selector tells the six sites apart (chance: 1/6), Dice rose
    pooled_test = {r["metric"]: float(r["value"]) for r in rows if r["split"] == "test" and r["site"] == "pooled"}
    assert pooled_test["selector-accuracy"] >= SELECTOR_ACCURACY_FLOOR, pooled_test
    assert pooled_test["dice-super"] >= DICE_FLOOR, pooled_test
    super_model, info = load_bundle(folder / "super_model.pt")
    assert f"gamma chosen on validation: {describe_gamma(info.gamma, info.site_names)}" in (
        folder / "summary.md").read_text()
    assert super_model(torch.rand(2, 3, 32, 32)).shape == (2, 2, 32, 32)
    assert superlinks(tmp_path / "flwr") == ""  # the script stopped the SuperLink it started
