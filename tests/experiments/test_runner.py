"""The study launchers: a study trains its federated runs in this process with ``--launcher in-process``."""

from __future__ import annotations

import pytest
from support.study_runs import PLAN as STUDY_PLAN

import experiments.study.run_plan as study
from experiments.runner import LAUNCHERS, launch_in_process
from experiments.study.runs import read_rows
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, load_checkpoint

pytestmark = pytest.mark.long_module(seconds=40)

# The study tests' plan (tests/support/study_runs.py), FedAvg alone, tiny, and a rule no run keeps up with
PLAN = (STUDY_PLAN.split("[methods]")[0]
        .replace('"fedavg", "centralized", "fedsm", "fedsm-extra"', '"fedavg"')
        .replace("min-rounds = 6", "min-rounds = 2").replace("max-rounds = 15", "max-rounds = 3")
        .replace("window = 2", "window = 1").replace("min-gain = 0.002", "min-gain = 0.5")
        .replace("check-every = 2", "check-every = 1")
        + "image-size = 32\ndata-scale = 0.1\nmax-local-steps = 2\n")


def test_a_study_with_the_in_process_launcher_trains_and_stops_by_its_rule(tmp_path, monkeypatch):
    # Prepare: a rule no run can keep up with (half a Dice point per round), so the run stops at min-rounds
    monkeypatch.setenv("FEDSM_SITE_STATE", str(tmp_path / "site-state"))
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(PLAN)

    # Execute
    study.main(["--plan", str(plan), "--out", str(out), "--launcher", "in-process"])

    # Assert: one run folder, stopped by the rule at round 2 of 3, its test rows in results.csv
    folders = [p for p in (out / "runs" / "synthetic-fundus" / "fedavg").glob("seed0-*/*") if p.is_dir()]
    assert len(folders) == 1
    checkpoint = load_checkpoint(folders[0] / CHECKPOINT_FILE)
    assert checkpoint["round"] == 2 and checkpoint["run-config"]["num-server-rounds"] == 3
    tests = [r for r in read_rows(out / "results.csv") if r["kind"] == "test"]
    assert {r["method"] for r in tests} == {"fedavg"} and {r["round"] for r in tests} == {"2"}
    assert all(0.0 < float(r["value"]) <= 1.0 for r in tests)


def test_the_launchers_are_named_and_the_in_process_one_refuses_an_environment(tmp_path):
    assert set(LAUNCHERS) == {"flwr-run", "in-process"}
    with pytest.raises(ValueError, match="takes no environment.*CLIENT_GPUS.*launch_run"):
        launch_in_process({"strategy": "fedavg"}, tmp_path, "a run", {"CLIENT_GPUS": "0"})
