"""A FedSM run with ``fine-tune-passes``: after the last round each site's personalized model is its fine-tuned global.

Through the real ServerApp and ClientApp handlers, in-process (``tests/support/in_process_grid.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.in_process_grid import TINY

from fedsm_core.config import RunConfig
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, load_checkpoint

TUNED = TINY.replace("fine-tune-passes=0", "fine-tune-passes=2")
ONE_ROUND = TUNED.replace("num-server-rounds=2", "num-server-rounds=1")


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[key], b[key]) for key in a)


def test_after_the_last_round_every_site_fine_tunes_the_global_model_into_its_personalized_model(tiny_fedsm,
                                                                                              in_process_app):
    # Execute: the session's one-round tiny FedSM run again, with two fine-tuning passes after its round
    folder, rows, grid = in_process_app(ONE_ROUND)

    # Assert: the rounds trained the same global model as without fine-tuning; each personalized model is now
    # the global model after the pass its site chose (pass 0: the global model itself), not SoftPull's
    state = load_checkpoint(folder / CHECKPOINT_FILE)["state"]
    plain = load_checkpoint(tiny_fedsm.first / CHECKPOINT_FILE)["state"]
    assert _same(state["global"], plain["global"])
    assert state["fine-tuned"]["round"] == 1
    passes = {site: passes for site, passes, _, _ in state["fine-tuned"]["sites"]}
    assert set(passes) == {f"site-{i}" for i in range(1, 7)} and all(0 <= p <= 2 for p in passes.values())
    for site, kept in passes.items():
        assert _same(state["personalized"][site], state["global"]) == (kept == 0), site
        assert not _same(state["personalized"][site], plain["personalized"][site]), site
    # the kept pass is never worse on the site's validation split than the global model it started from
    assert all(after >= before for _, _, before, after in state["fine-tuned"]["sites"])
    summary = (folder / "summary.md").read_text()
    assert "personalized models fine-tuned from the final global model after the last round" in summary
    assert sum("fine-tuned the global model into a personalized model: site-" in line for line in grid.log) == 6
    assert {r["split"] for r in rows} >= {"val", "test"}
    # fine-tune-gamma = "cross-fit" (default): every site whose validation split halves scored the last
    # validation with its halves' models, since the server sent it back exactly the model it replied with
    crossed = {line.split("site ")[1].split(":")[0] for line in grid.log if "sweeps cross-fitted" in line}
    assert crossed == set(passes), crossed

    # Execute: extending the run past its fine-tuned round
    # Assert: refused, since SoftPull would continue from the fine-tuned models
    with pytest.raises(ValueError, match="fine-tuned after its last round, 1 .* start a new run"):
        in_process_app(f"{TUNED} resume-from='{folder / CHECKPOINT_FILE}'", name="extended")
    # Execute: finishing its checkpoint (round 1 of 1) without fine-tuning
    # Assert: refused, since the checkpoint holds the fine-tuned models, not SoftPull's
    plain = TINY.replace("num-server-rounds=2", "num-server-rounds=1")
    with pytest.raises(ValueError, match="already fine-tuned .*fine-tune-passes = 2.* fine-tune-passes = 0"):
        in_process_app(f"{plain} resume-from='{folder / CHECKPOINT_FILE}'", name="plain")


STOP = "stop-window=1 stop-min-gain=1.0 stop-min-rounds=2"


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """At most 3 rounds that the rule ends after round 2, then two fine-tuning passes: folder, rows, grid, site state.

    A gain of one whole Dice point over one round is never met, so the rule holds at its first look, round 2.
    """
    from support.in_process_grid import metrics_rows, only_run_folder, run_app

    root = tmp_path_factory.mktemp("stopped")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDSM_SITE_STATE", str(root / "site-state"))
        grid = run_app(root / "runs", f"{TUNED.replace('num-server-rounds=2', 'num-server-rounds=3')} {STOP}", 6)
    folder = only_run_folder(root / "runs")
    return folder, metrics_rows(folder), grid, root / "site-state"


def test_a_run_the_stopping_rule_ends_fine_tunes_after_its_round_and_validates_that_round_again(stopped_run):
    # Execute: the module's run (stopped_run)
    folder, rows, grid, _ = stopped_run

    # Assert: training stopped after round 2, every site fine-tuned once, and round 2's validation (which chose
    # gamma) is recorded once per site and metric: the one taken after fine-tuning replaced the first
    assert max(int(r["round"]) for r in rows) == 2
    assert sum("fine-tuned the global model into a personalized model: site-" in line for line in grid.log) == 6
    val = [(r["site"], r["metric"]) for r in rows if r["split"] == "val" and r["round"] == "2"]
    assert val and len(val) == len(set(val))
    assert {r["round"] for r in rows if r["split"] == "test"} == {"2"}
    assert "personalized models fine-tuned from the final global model" in (folder / "summary.md").read_text()


def test_its_checkpoint_finished_without_fine_tuning_is_the_plain_run_of_as_many_rounds(stopped_run, tiny_fedsm,
                                                                                       in_process_app, monkeypatch):
    # Arrange: the stopped run's checkpoint holds round 2 before the fine-tuning; the plain 2-round run
    # (fine-tune-passes = 0, tiny_fedsm.straight) trained the same rounds
    stopped, _, _, site_state = stopped_run
    monkeypatch.setenv("FEDSM_SITE_STATE", str(site_state))

    # Execute: finish that checkpoint as a run of 2 rounds without fine-tuning (no round left to train)
    finished, rows, grid = in_process_app(f"{TINY} resume-from='{stopped / CHECKPOINT_FILE}'", name="finished")

    # Assert: no site trained or fine-tuned; the same models, gamma and numbers as the plain run, bit for bit,
    # and the new folder keeps its checkpoint, with this run's settings
    assert not any("fine-tuned the global model" in line for line in grid.log)
    assert all(message_type != "train" for message_type, _ in grid.sent)
    state, plain = load_checkpoint(finished / CHECKPOINT_FILE), load_checkpoint(tiny_fedsm.straight / CHECKPOINT_FILE)
    assert state["round"] == 2 and state["run-config"]["fine-tune-passes"] == 0
    assert _same(state["state"]["global"], plain["state"]["global"])
    for site, weights in plain["state"]["personalized"].items():
        assert _same(state["state"]["personalized"][site], weights), site
    assert state["state"]["gamma"] == plain["state"]["gamma"]
    assert rows == tiny_fedsm.straight_rows


@pytest.mark.parametrize("strategy", ["fedavg", "fedsm-extra", "fedbn"])
def test_strategies_without_fedsm_personalized_models_ignore_the_default_fine_tuning(strategy):
    # fine-tune-passes is FedSM's (default 30); the others have no personalized models to replace, and their
    # configuration is accepted with it, as with softpull-lambda
    config = RunConfig.from_mapping({"strategy": strategy})
    assert config.fine_tune_passes == 30
