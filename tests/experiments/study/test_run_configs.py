"""A study records what each finished run trained with, and a default changed since marks the run stale.

The stand-in for ``flwr run`` (:class:`support.study_runs.FakeFlower`) saves the
run config in its checkpoints as the ServerApp does. A changed default is
played by editing a run's record: the record then says the run trained with a
value other than the one the plan resolves to today, which is exactly what a
default changed in ``RunConfig`` (and ``pyproject.toml``) after the run leaves.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from support.study_runs import PLAN, FakeFlower, prepare_study

import experiments.study.run_plan as study
import fedsm_core.run_files.checkpoint as checkpoints
from experiments.study.run_configs import (
    CONFIGS_FILE,
    STALE_ROWS_FILE,
    check_configs,
    differences,
    label,
    read_configs,
    resolve,
    write_configs,
)
from experiments.study.runs import read_rows
from fedsm_core.config import RunConfig

TWO_METHODS = PLAN.replace('"fedavg", "centralized", "fedsm", "fedsm-extra"', '"fedavg", "centralized"') \
    .replace('fedsm-extra = { rounds-from = "fedsm" }', "")


@pytest.fixture()
def finished_study(tmp_path, monkeypatch):
    """FedAvg and centralized (which takes FedAvg's rounds), run to the end; returns (arguments, out, pooled calls)."""
    args, out, pooled = prepare_study(tmp_path, monkeypatch, TWO_METHODS)
    study.main(args, launch=FakeFlower())
    return args, out, pooled


def _change_recorded(out, method: str, key: str, value: object) -> None:
    records = read_configs(out)
    (label_,) = [k for k in records if k[1] == method]
    records[label_]["config"][key] = value
    write_configs(out, records)


def test_every_finished_run_is_recorded_with_the_config_it_trained_with(finished_study):
    args, out, _ = finished_study
    records = read_configs(out)
    jobs = study.plan_jobs(study.load_plan(args[1]))

    assert sorted(records) == sorted(label(key) for key, _, _ in jobs)
    for key, settings, _ in jobs:
        record = records[label(key)]
        assert record["config"] == resolve(settings)
        assert record["config"]["softpull-lambda"] == RunConfig().softpull_lambda  # defaults filled in
        assert "num-server-rounds" not in record["config"]  # the rule decides it; the key holds the rule
    fedavg = records[label(jobs[0][0])]
    assert fedavg["source"].startswith("checkpoint of chunk-")  # what the (stand-in) ServerApp saved
    assert records[label(jobs[1][0])]["source"] == "resolved by the study"  # centralized has no checkpoint


def test_a_changed_default_stops_the_sitting_before_anything_trains(finished_study):
    args, out, pooled = finished_study
    _change_recorded(out, "fedavg", "lr", 0.5)
    results = (out / "results.csv").read_bytes()
    launch = FakeFlower()

    with pytest.raises(ValueError, match=r"(?s)synthetic-fundus fedavg seed 0: lr: 0\.5 -> .*"
                                         r"centralized seed 0: takes its rounds from fedavg, which is stale.*"
                                         r"--rerun-stale.*--keep-stale"):
        study.main(args, launch=launch)

    assert launch.calls == [] and len(pooled) == 1
    assert (out / "results.csv").read_bytes() == results


def test_keep_stale_tabulates_the_runs_as_they_are(finished_study, capsys):
    args, out, pooled = finished_study
    _change_recorded(out, "fedavg", "lr", 0.5)
    results = (out / "results.csv").read_bytes()
    launch = FakeFlower()

    study.main([*args, "--keep-stale"], launch=launch)

    assert launch.calls == [] and len(pooled) == 1
    assert (out / "results.csv").read_bytes() == results
    assert "keeping stale runs" in capsys.readouterr().out
    assert read_configs(out)[next(k for k in read_configs(out) if k[1] == "fedavg")]["config"]["lr"] == 0.5


def test_rerun_stale_trains_the_run_and_those_that_take_its_rounds_again_and_keeps_the_old_rows(finished_study):
    args, out, pooled = finished_study
    old = read_rows(out / "results.csv")
    _change_recorded(out, "fedavg", "lr", 0.5)
    launch = FakeFlower()

    study.main([*args, "--rerun-stale"], launch=launch)

    assert [c["strategy"] for c in launch.calls] == ["fedavg"] and len(pooled) == 2
    assert read_rows(out / STALE_ROWS_FILE) == old  # both runs' old rows, as evidence
    assert read_rows(out / "results.csv") == old  # the stand-in trains to the same numbers
    jobs = study.plan_jobs(study.load_plan(args[1]))
    assert all(read_configs(out)[label(key)]["config"] == resolve(settings) for key, settings, _ in jobs)
    assert len(list((out / "runs" / "synthetic-fundus" / "fedavg").glob("seed0-*.stale-*"))) == 1
    study.main(args, launch=launch)  # and the next sitting finds nothing stale
    assert len(launch.calls) == 1


def test_measured_with_keeps_a_changed_default_for_the_finished_runs_and_their_keys(finished_study):
    # Prepare: the runs were measured with aggregation = "median", today's default is "mean"
    args, out, pooled = finished_study
    plan = args[1]
    old_keys = [key for key, _, _ in study.plan_jobs(study.load_plan(plan))]
    for method in ("fedavg", "centralized"):
        _change_recorded(out, method, "aggregation", "median")
    with pytest.raises(ValueError, match=rf"fedavg seed 0: aggregation: 'median' -> '{RunConfig().aggregation}'"):
        study.main(args, launch=FakeFlower())

    # Execute: the plan pins the value its runs were measured with
    with open(plan, "a") as handle:
        handle.write('[measured-with]\naggregation = "median"\n')
    launch = FakeFlower()
    study.main(args, launch=launch)

    # Assert: same keys, nothing stale, nothing trained again; a new run would train with the pinned value
    jobs = study.plan_jobs(study.load_plan(plan))
    assert [key for key, _, _ in jobs] == old_keys
    assert launch.calls == [] and len(pooled) == 1
    assert all(settings["aggregation"] == "median" for _, settings, _ in jobs)


def test_a_run_finished_unrecorded_is_checked_from_its_checkpoint_else_reported_unchecked(finished_study, capsys):
    args, out, _ = finished_study
    (out / CONFIGS_FILE).unlink()  # finished before the study recorded configs
    capsys.readouterr()

    study.main(args, launch=FakeFlower())
    records = read_configs(out)
    assert [r["method"] for r in records.values()] == ["fedavg"]  # from its checkpoint; centralized has none
    assert "1 finished run(s) without a recorded run config" in capsys.readouterr().out

    _change_recorded(out, "fedavg", "lr", 0.5)
    shutil.rmtree(out / "runs")  # a clone: results.csv and the records, no run folders
    with pytest.raises(ValueError, match="fedavg seed 0: lr: 0.5 ->"):
        study.main(args, launch=FakeFlower())
    (out / CONFIGS_FILE).unlink()
    study.main(args, launch=FakeFlower())
    assert "2 finished run(s) without a recorded run config" in capsys.readouterr().out
    assert not (out / CONFIGS_FILE).exists()


def test_differences_name_changed_and_removed_keys_and_compare_added_ones_only_when_listed(monkeypatch):
    assert differences({"lr": 0.001, "a": 1}, {"lr": 0.002, "b": "x"}) == ["a: 1 -> None", "lr: 0.001 -> 0.002"]
    monkeypatch.setitem(checkpoints.BEFORE_THE_KEY, "b", "y")  # b's default no longer reproduces the old behaviour
    assert differences({"lr": 0.001}, {"lr": 0.001, "b": "x"}) == ["b: 'y' -> 'x'"]
    assert differences({"lr": 0.001}, json.loads(json.dumps({"lr": 0.001}))) == []


def test_a_checkpoint_from_before_a_key_existed_takes_the_value_that_reproduces_the_old_behaviour(
        finished_study, monkeypatch):
    # Prepare: FedAvg's checkpoint without the key min-local-steps, as one saved before the key existed
    args, out, _ = finished_study
    (out / CONFIGS_FILE).unlink()
    (checkpoint,) = (out / "runs").glob("synthetic-fundus/fedavg/*/chunk-*/checkpoint.pt")
    payload = torch.load(checkpoint, weights_only=True)
    del payload["run-config"]["min-local-steps"]
    torch.save(payload, checkpoint)

    # Execute / Assert: today's default (0) is what runs did before the key: nothing stale
    study.main(args, launch=FakeFlower())
    assert "min-local-steps" not in read_configs(out)[next(k for k in read_configs(out) if k[1] == "fedavg")]["config"]

    # Execute / Assert: had the default changed (the old behaviour listed as 5 here), the run is stale
    (out / CONFIGS_FILE).unlink()
    monkeypatch.setitem(checkpoints.BEFORE_THE_KEY, "min-local-steps", 5)
    with pytest.raises(ValueError, match="fedavg seed 0: min-local-steps: 5 -> 0"):
        study.main(args, launch=FakeFlower())


@pytest.mark.parametrize("name", ["reference-defaults", "min-local-steps"])
def test_a_committed_study_still_names_its_finished_runs_and_none_is_stale(name):
    # A default changed without the plan's [measured-with] would orphan these runs (new keys) or make them stale
    root = Path(__file__).resolve().parents[3]
    out = root / "experiments" / "results" / name
    jobs = study.plan_jobs(study.load_plan(root / "experiments" / "plans" / f"{name}.toml"))
    recorded = read_rows(out / "results.csv")
    finished = {key for key, _, _ in jobs if study.finished_rows(key, out / "no-runs", recorded) is not None}

    assert {row["run"] for row in recorded} == {key.digest for key in finished}
    check = check_configs(jobs, finished, read_configs(out), out / "no-runs")
    assert check.stale == {}
    assert len(check.unchecked) < len(finished)  # runs recorded before configs were are unchecked, not the rest
