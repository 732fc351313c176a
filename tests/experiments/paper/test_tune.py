"""The validation sweep's choices and how the comparison applies them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.study_runs import fake_run_folder

from experiments.paper.tune import (
    DEFAULT_GRID,
    STEPS,
    choose,
    load_trials,
    main,
    parse_grid,
    select_steps,
    sweep,
    validation_score,
    write_outputs,
)
from experiments.runner import describe_chosen, load_chosen
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE


def test_choose_takes_the_best_score_and_breaks_ties_toward_the_smaller_value():
    assert choose({0.001: 0.80, 0.002: 0.85, 0.005: 0.84}) == 0.002
    assert choose({0.9: 0.85, 0.5: 0.85, 0.7: 0.10}) == 0.5


def test_validation_score_is_the_last_evaluated_round():
    assert validation_score([(3, 0.7), (10, 0.6), (5, 0.9)]) == 0.6
    with pytest.raises(RuntimeError, match="no pooled validation Dice"):
        validation_score([])


def test_grid_items_replace_defaults_and_bad_items_name_the_fix():
    grid = parse_grid(["lr=0.01,0.02"])
    assert grid["lr"] == [0.01, 0.02]
    assert grid["softpull-lambda"] == DEFAULT_GRID["softpull-lambda"]
    with pytest.raises(ValueError, match="expected one of"):
        parse_grid(["momentum=0.9"])
    with pytest.raises(ValueError, match="must be numbers"):
        parse_grid(["lr=fast"])
    assert parse_grid(["amplitude-window=0,3"])["amplitude-window"] == [0, 3]
    with pytest.raises(ValueError, match="must be numbers"):
        parse_grid(["amplitude-window=1.5"])


def test_methods_keep_only_the_steps_whose_choice_they_use():
    steps = select_steps(["fedavg", "fedbn", "harmofl", "fedsm"])
    assert {"fedbn", "harmofl", "knn-per"} <= set(steps[0][3])  # FedAvg's lr reaches every FedAvg-based method
    assert [(m, k) for m, k, _, _ in steps] == [("fedavg", "lr"), ("fedsm", "softpull-lambda"),
                                                ("harmofl", "amplitude-window")]
    assert select_steps(None) == STEPS
    with pytest.raises(ValueError, match="unknown \\['fedsgd'\\]"):
        select_steps(["fedsgd"])


def test_a_second_call_reads_finished_candidates_and_refuses_other_settings(tmp_path, monkeypatch):
    calls = []

    def fake_run(method, seed, overrides, out, start=None):
        calls.append((method, overrides["lr"]))
        return [], [(5, overrides["lr"] * 100)]

    monkeypatch.setattr("experiments.paper.tune.run_federated", fake_run)
    settings = {"run-config": {"num-server-rounds": 5}, "seed": 0, "grid": {"lr": [0.001, 0.002]}}
    assert load_trials(tmp_path, settings) == []
    steps = select_steps(["fedavg"])
    chosen, trials = sweep({"num-server-rounds": 5}, {"lr": [0.001, 0.002]}, 0, tmp_path, steps, [])
    assert chosen["fedavg"] == {"lr": 0.002} and len(calls) == 2
    again, _ = sweep({"num-server-rounds": 5}, {"lr": [0.001, 0.002]}, 0, tmp_path, steps,
                     load_trials(tmp_path, settings))
    assert again == chosen and len(calls) == 2  # both candidates read from sweep.csv, none rerun
    sweep({"num-server-rounds": 6}, {"lr": [0.001, 0.002]}, 0, tmp_path, steps, load_trials(tmp_path, settings))
    assert len(calls) == 4  # another run config: the same values are new candidates
    with pytest.raises(ValueError, match="tune.json: this folder holds a sweep with other settings"):
        load_trials(tmp_path, {**settings, "seed": 1})


def test_a_narrower_or_interrupted_sweep_keeps_the_candidates_it_did_not_reach(tmp_path, monkeypatch):
    calls = []

    def fake_run(method, seed, overrides, out, start=None):
        calls.append((method, overrides.get("softpull-lambda", overrides["lr"])))
        return [], [(5, overrides.get("softpull-lambda", overrides["lr"]))]

    monkeypatch.setattr("experiments.paper.tune.run_federated", fake_run)
    settings = {"run-config": {"num-server-rounds": 5}, "seed": 0}
    base, steps = {"num-server-rounds": 5}, select_steps(["fedavg", "fedsm"])
    grid = {"lr": [0.001, 0.002], "softpull-lambda": [0.5, 0.9]}
    sweep(base, grid, 0, tmp_path, steps, [])
    assert len(calls) == 4

    def interrupted(method, seed, overrides, out, start=None):
        raise KeyboardInterrupt

    monkeypatch.setattr("experiments.paper.tune.run_federated", interrupted)
    wider = {"lr": [0.001, 0.002, 0.005], "softpull-lambda": [0.5, 0.9]}
    with pytest.raises(KeyboardInterrupt):  # stopped in its first new candidate, before the FedSM step
        sweep(base, wider, 0, tmp_path, steps, load_trials(tmp_path, settings))
    kept = load_trials(tmp_path, settings)
    assert sorted((t["method"], t["value"]) for t in kept) == [("fedavg", 0.001), ("fedavg", 0.002),
                                                               ("fedsm", 0.5), ("fedsm", 0.9)]
    monkeypatch.setattr("experiments.paper.tune.run_federated", fake_run)
    _, trials = sweep(base, {"lr": [0.002], "softpull-lambda": [0.9]}, 0, tmp_path, steps, kept)
    assert len(calls) == 4 and len(trials) == 4 and len(load_trials(tmp_path, settings)) == 4


def _fake_fedsm_extra_runs(monkeypatch, score) -> list[dict]:
    """Replace ``flwr run`` by a run folder finished at the last round, scored ``score(extra-rounds)``."""
    launched: list[dict] = []

    def fake_launch(settings, runs, label, env=None):
        launched.append(dict(settings))
        config = {k: v for k, v in settings.items() if k != "resume-from"}
        total = settings["num-server-rounds"] + settings["extra-rounds"]
        return fake_run_folder(runs, f"run-{len(launched)}", total, config, tested=True,
                           score=score(settings["extra-rounds"]))

    monkeypatch.setattr("experiments.runner.launch_run", fake_launch)
    return launched


def test_fedsm_extra_candidates_grow_in_order_each_continuing_the_previous_finished_run(tmp_path, monkeypatch):
    # Prepare: a launcher that finishes every run at its last round, scoring it by its extra rounds
    launched = _fake_fedsm_extra_runs(monkeypatch, lambda extra: extra / 100)
    steps = tuple(s for s in STEPS if s[0] == "fedsm-extra")
    base = {"num-server-rounds": 6, "image-size": 32}

    # Execute: a sweep given its values out of order, then a wider one after the 40-round candidate's folder was lost
    chosen, _ = sweep(base, {"extra-rounds": [40, 10, 20]}, 0, tmp_path, steps, load_trials(tmp_path, {"seed": 0}))
    first = [s.get("resume-from") for s in launched]
    for folder in (tmp_path / "fedsm-extra-extra-rounds-40").rglob(CHECKPOINT_FILE):
        folder.unlink()
    sweep(base, {"extra-rounds": [10, 20, 40, 80]}, 0, tmp_path, steps, load_trials(tmp_path, {"seed": 0}))

    # Assert: 10 starts afresh, 20 continues 10's checkpoint and 40 continues 20's; 80 falls back to 20's
    assert [s["extra-rounds"] for s in launched] == [10, 20, 40, 80]
    checkpoints = {v: next((tmp_path / f"fedsm-extra-extra-rounds-{v}").rglob(CHECKPOINT_FILE), None) for v in (10, 20)}
    assert first == [None, str(checkpoints[10].resolve()), str(checkpoints[20].resolve())]
    assert Path(launched[3]["resume-from"]) == checkpoints[20].resolve()
    assert chosen == {"fedsm-extra": {"extra-rounds": 40}}


def test_one_step_added_to_an_earlier_sweep_starts_from_its_choices_and_keeps_the_others(tmp_path, monkeypatch):
    # Prepare: an earlier sweep's choices, without FedBN (it ran with the defaults)
    launched = _fake_fedsm_extra_runs(monkeypatch, lambda extra: 0.9 - extra / 1000)
    earlier = {"fedavg": {"lr": 0.002}, "fedsm-extra": {"lr": 0.005, "softpull-lambda": 0.5}}
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    out = tmp_path / "sweep"

    # Execute
    main(["--out", str(out), "--rounds", "4", "--run-config", "image-size=32", "--steps", "extra-rounds",
          "--chosen", str(tmp_path / "earlier.json"), "--grid", "extra-rounds=2,4"])

    # Assert: only FedSM-extra ran, with the earlier choices; the output is the earlier choices plus extra-rounds
    assert [(s["strategy"], s["lr"], s["softpull-lambda"], s["extra-rounds"]) for s in launched] == [
        ("fedsm-extra", 0.005, 0.5, 2), ("fedsm-extra", 0.005, 0.5, 4)]
    assert json.loads((out / "chosen.json").read_text()) == {
        "fedavg": {"lr": 0.002}, "fedsm-extra": {"lr": 0.005, "softpull-lambda": 0.5, "extra-rounds": 2}}
    with pytest.raises(ValueError, match="--steps: unknown \\['rounds'\\]"):
        select_steps(None, ["rounds"])


def test_every_step_sweeps_a_real_run_config_key_and_fedavgs_lr_reaches_the_pooled_methods():
    from fedsm_core.config import RunConfig

    keys = set(RunConfig().to_mapping())
    assert all(key in keys for _, key, _, _ in STEPS)
    heirs_of_lr = next(h for m, k, _, h in STEPS if m == "fedavg" and k == "lr")
    assert {"centralized", "local", "fedsm"} <= set(heirs_of_lr)


def test_chosen_settings_override_the_run_config_per_method(tmp_path):
    path = tmp_path / "chosen.json"
    path.write_text(json.dumps({"fedprox": {"proximal-mu": 0.1}, "scaffold": {"lr": 0.0005}}))
    chosen = load_chosen(path, {"lr": 0.002, "num-server-rounds": 5})
    assert chosen["fedprox"] == {"lr": 0.002, "num-server-rounds": 5, "proximal-mu": 0.1}
    assert chosen["scaffold"]["lr"] == 0.0005
    assert chosen["fedavg"] == {"lr": 0.002, "num-server-rounds": 5}
    text = describe_chosen(chosen, {"lr": 0.002}, ["fedavg", "fedprox"])
    assert "- fedprox: num-server-rounds = 5, proximal-mu = 0.1" in text


def test_chosen_files_with_unknown_methods_or_bad_values_are_refused(tmp_path):
    path = tmp_path / "chosen.json"
    path.write_text(json.dumps({"fedsgd": {"lr": 0.1}}))
    with pytest.raises(ValueError, match="unknown methods \\['fedsgd'\\]"):
        load_chosen(path, {})
    path.write_text(json.dumps({"fedsm": {"softpull-lambda": 7}}))
    with pytest.raises(ValueError, match="settings for fedsm"):
        load_chosen(path, {})
    with pytest.raises(ValueError, match="cannot read"):
        load_chosen(tmp_path / "missing.json", {})


def test_outputs_mark_the_chosen_candidates(tmp_path):
    trials = [{"method": "fedavg", "key": "lr", "value": 0.001, "val-dice": 0.5, "seconds": 1.0},
              {"method": "fedavg", "key": "lr", "value": 0.002, "val-dice": 0.6, "seconds": 1.0}]
    write_outputs(tmp_path, {"fedavg": {"lr": 0.002}}, trials, "header")
    table = (tmp_path / "sweep.md").read_text()
    assert "| fedavg | lr | 0.002 | 0.6000 | yes |" in table
    assert "| fedavg | lr | 0.001 | 0.5000 |  |" in table
    assert json.loads((tmp_path / "chosen.json").read_text()) == {"fedavg": {"lr": 0.002}}
