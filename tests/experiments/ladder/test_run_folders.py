"""Re-scoring finished app runs from their folders."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from experiments.ladder import final_fine_tuning, gamma_rules, run_folders
from experiments.runner import read_rows
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, load_checkpoint


def test_a_run_folder_rescored_gives_the_runs_own_test_dice_of_each_model(tiny_fedsm, tmp_path):
    # Arrange: a finished two-round FedSM run of the app (fine-tune-passes = 0) and its own test metrics
    folder = tiny_fedsm.straight
    test = {(r["metric"], r["site"]): float(r["value"]) for r in tiny_fedsm.straight_rows
            if r["split"] == "test" and r["site"] != "pooled"}
    command = ["--out", str(tmp_path), "--run-folders", str(folder), "--max-passes", "1"]

    # Execute
    assert final_fine_tuning.main(command) == 0
    assert final_fine_tuning.main(command) == 0  # done: skipped

    # Assert: SoftPull's arm is the run's own test Dice model by model (each site's personalized model, the
    # global model, the super model at the gamma the run's rule chose), so the folder's models, selector head
    # and sites were restored as the run had them
    rows = [r for r in read_rows(tmp_path / "final_fine_tuning.csv") if r["models"] == "softpull"]
    config, _ = run_folders.read_run(folder)
    assert {r["method"] for r in rows} == {f"fedsm@{folder.name}"} and config.gamma_selection == "client-average"
    for rule, metric in (("own", "dice-personal"), ("global", "dice-global"), ("client-average", "dice-super")):
        rescored = {r["site"]: float(r["dice"]) for r in rows if r["rule"] == rule}
        assert rescored == pytest.approx({site: test[(metric, site)] for site in rescored}, abs=1e-5), rule
        assert len(rescored) == 6, rule
    assert test[("dice-personal", "site-1")] != pytest.approx(test[("dice-global", "site-1")], abs=1e-3)
    assert f"fedsm@{folder.name}" in (tmp_path / "final_fine_tuning.md").read_text()


def test_a_run_folder_is_refused_when_it_cannot_be_rescored(tiny_fedsm):
    folder = tiny_fedsm.straight
    config, checkpoint = run_folders.read_run(folder)

    tuned = copy.deepcopy(checkpoint)
    tuned["state"]["fine-tuned"] = {"round": 2, "sites": []}
    with pytest.raises(ValueError, match="fine-tuned after the last round.*fedsm-softpull"):
        run_folders.load_run_folder(folder, config, tuned)

    early = {**checkpoint, "round": 1}
    with pytest.raises(ValueError, match="at round 1 of 2"):
        run_folders.load_run_folder(folder, config, early)

    with pytest.raises(ValueError, match="strategy = 'fedavg'"):
        run_folders.load_run_folder(folder, dataclasses.replace(config, strategy="fedavg"), checkpoint)
    assert load_checkpoint(folder / CHECKPOINT_FILE)["round"] == 2  # the run's own file untouched


def test_the_command_line_asks_for_cells_or_run_folders(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gamma_rules.main(["--out", str(tmp_path)])
    assert "--datasets (ladder cells) or --run-folders (app runs)" in capsys.readouterr().err
