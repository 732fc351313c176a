"""End to end: a run resumed from its checkpoint continues exactly as an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedsm_core.checkpoint import CHECKPOINT_FILE, load_checkpoint
from test_end_to_end import TINY, _finished_run, _run


def _only_run(runs: Path) -> Path:
    (folder,) = list(runs.iterdir())
    return folder


def _assert_same_arrays(left, right, where: str) -> None:
    if isinstance(left, dict):
        assert set(left) == set(right), where
        for key in left:
            _assert_same_arrays(left[key], right[key], f"{where}/{key}")
    elif isinstance(left, np.ndarray):
        np.testing.assert_allclose(left, right, rtol=1e-5, atol=1e-6, err_msg=where)


def _assert_same_states(left: Path, right: Path, server_round: int) -> None:
    """Both run folders' checkpoints are from ``server_round`` and hold the same models, selector and optimizer."""
    a = load_checkpoint(left / CHECKPOINT_FILE)
    b = load_checkpoint(right / CHECKPOINT_FILE)
    assert a["round"] == b["round"] == server_round
    for key in ("global", "personalized", "selector", "selector-optimizer"):
        _assert_same_arrays(a["state"][key], b["state"][key], key)


def test_a_resumed_fedsm_run_ends_where_the_uninterrupted_run_ends_and_changed_settings_are_refused(tmp_path):
    # Arrange: one round, interrupted there
    first = _run(tmp_path / "first", TINY.replace("num-server-rounds=2", "num-server-rounds=1"))
    _finished_run(tmp_path / "first", first)
    checkpoint = _only_run(tmp_path / "first" / "runs") / CHECKPOINT_FILE
    assert load_checkpoint(checkpoint)["round"] == 1

    # Execute: a resume with a changed setting, the resume for round 2, and an uninterrupted run
    changed = _run(tmp_path / "changed", f"{TINY} lr=0.01 resume-from='{checkpoint}'")
    resumed = _run(tmp_path / "resumed", f"{TINY} resume-from='{checkpoint}'")
    straight = _run(tmp_path / "straight", TINY)

    # Assert
    assert changed.returncode != 0
    assert "lr: 0.002 -> 0.01" in changed.stdout + changed.stderr
    resumed_folder, resumed_rows = _finished_run(tmp_path / "resumed", resumed)
    straight_folder, straight_rows = _finished_run(tmp_path / "straight", straight)
    _assert_same_states(resumed_folder, straight_folder, 2)
    assert {int(r["round"]) for r in resumed_rows if r["split"] == "val"} == {1, 2}
    val = {(r["round"], r["site"], r["metric"]): float(r["value"]) for r in straight_rows if r["split"] == "val"}
    for row in resumed_rows:
        if row["split"] == "val" and row["metric"].startswith("dice"):
            assert abs(float(row["value"]) - val[(row["round"], row["site"], row["metric"])]) < 1e-4


def test_fedsm_extra_continued_with_more_extra_rounds_ends_where_a_run_of_that_length_ends(tmp_path):
    # Arrange: a finished FedSM-extra run with one selector round (the tune's smaller candidate)
    extra = TINY + ' strategy="fedsm-extra"'
    short = _run(tmp_path / "short", f"{extra} extra-rounds=1")
    short_folder, _ = _finished_run(tmp_path / "short", short)

    # Execute: continue it to two selector rounds, and run two selector rounds straight
    grown = _run(tmp_path / "grown", f"{extra} extra-rounds=2 resume-from='{short_folder / CHECKPOINT_FILE}'")
    straight = _run(tmp_path / "straight", f"{extra} extra-rounds=2")

    # Assert: the same models and selector, and the same validation and test scores in the last round
    grown_folder, grown_rows = _finished_run(tmp_path / "grown", grown)
    straight_folder, straight_rows = _finished_run(tmp_path / "straight", straight)
    _assert_same_states(grown_folder, straight_folder, 4)
    last = {(r["split"], r["site"], r["metric"]): float(r["value"]) for r in straight_rows if r["round"] == "4"}
    grown_last = {(r["split"], r["site"], r["metric"]): float(r["value"]) for r in grown_rows if r["round"] == "4"}
    assert grown_last.keys() == last.keys() and ("val", "pooled", "dice-super") in last
    for where, value in grown_last.items():
        assert abs(value - last[where]) < 1e-4, where
