"""The comparison script: its in-process methods (centralized and local) and how it continues a federated run."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.study_runs import fake_run_folder

from experiments.paper.compare import main
from experiments.paper.comparison_table import read_long_csv
from experiments.runner import parse_overrides, run_federated
from fedsm_core.config import RunConfig
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE

TINY = "num-server-rounds=1 image-size=32 data-scale=0.1 max-local-steps=1"


def test_overrides_take_toml_values():
    assert parse_overrides('lr=0.002 selector-negatives=false dataset="synthetic-fundus" encoder=resnet18') == {
        "lr": 0.002, "selector-negatives": False, "dataset": "synthetic-fundus", "encoder": "resnet18",
    }
    with pytest.raises(ValueError, match="not key=value"):
        parse_overrides("lr")


def test_centralized_and_local_rows_cover_every_site_and_the_table_lists_them(tmp_path):
    # Execute
    main(["--methods", "centralized", "local", "--seeds", "0", "--run-config", TINY, "--out", str(tmp_path)])

    # Assert
    rows = read_long_csv(tmp_path / "results.csv")
    methods = ["Centralized", *[f"Local-{k}" for k in range(1, 7)]]
    columns = {f"site-{k}" for k in range(1, 7)} | {"pooled"}
    for method in methods:
        assert {r["site"] for r in rows if r["method"] == method} == columns
    assert all(0.0 <= float(r["value"]) <= 1.0 for r in rows)
    table = (tmp_path / "table.md").read_text()
    for method in methods:
        assert f"| {method} |" in table
    assert (tmp_path / "curves.png").exists()


def test_a_bad_setting_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match="image-size = 48"):
        main(["--methods", "centralized", "--seeds", "0", "--run-config", "image-size=48", "--out", str(tmp_path)])


def test_rows_are_labelled_by_the_normalization_that_ran():
    from experiments.runner import method_label

    assert method_label("FedBN", RunConfig(strategy="fedbn")) == "FedBN"
    assert method_label("FedAvg", RunConfig(strategy="fedavg")) == "FedAvg"
    assert method_label("FedAvg", RunConfig(strategy="fedavg", segmentation_norm="batch")) == "FedAvg (BatchNorm)"
    assert method_label("Centralized", RunConfig(segmentation_norm="batch")) == "Centralized (BatchNorm)"


def test_an_interrupted_run_of_the_same_settings_is_continued_from_its_checkpoint(tmp_path, monkeypatch):
    # Prepare: under FedSM's runs folder, a finished run of 8 rounds (a test, not a resume point), an
    # interrupted run of these settings at round 6, and an interrupted run of another softpull-lambda at round 8
    launched = []

    def fake_launch(settings, runs, label, env=None):
        launched.append(dict(settings))
        settings = {k: v for k, v in settings.items() if k != "resume-from"}
        return fake_run_folder(runs, f"run-{len(launched)}", 10, settings, tested=True)

    monkeypatch.setattr("experiments.runner.launch_run", fake_launch)
    base = {"num-server-rounds": 10, "softpull-lambda": 0.9, "image-size": 32}
    settings = {**base, "strategy": "fedsm", "seed": 0}
    runs = tmp_path / "runs" / "fedsm-seed0"
    fake_run_folder(runs, "a-finished", 8, {**settings, "num-server-rounds": 8}, tested=True)
    interrupted = fake_run_folder(runs, "b-interrupted", 6, settings, tested=False)
    fake_run_folder(runs, "c-other-lambda", 8, {**settings, "softpull-lambda": 0.5}, tested=False)

    # Execute
    run_federated("fedsm", 0, base, tmp_path)
    run_federated("fedsm", 0, {**base, "softpull-lambda": 0.7}, tmp_path)

    # Assert: the first call continues the round-6 checkpoint of its own settings; the second starts afresh
    assert Path(launched[0]["resume-from"]) == (interrupted / CHECKPOINT_FILE).resolve()
    assert "resume-from" not in launched[1]
