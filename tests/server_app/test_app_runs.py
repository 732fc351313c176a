"""Whole runs of the ServerApp's main loop against in-process ClientApps (``tests/in_process_grid.py``).

Each strategy end to end, the run folder it writes, resuming from a checkpoint,
and nodes that serve several sites; no SuperLink or Ray (``tests/test_end_to_end.py``
checks that ``flwr run`` gives the same numbers).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.in_process_grid import TINY
from support.png_sites import write_slice_site

from fedsm_core.run_files.bundle import load_bundle
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, load_checkpoint

pytestmark = pytest.mark.long_module(seconds=120)

SITES = {f"site-{i}" for i in range(1, 7)}


def test_a_fedsm_run_writes_metrics_summary_report_and_a_super_model_that_learned(tiny_fedsm):
    # Execute: two FedSM rounds (tiny_fedsm.straight)
    folder, rows = tiny_fedsm.straight, tiny_fedsm.straight_rows

    # Assert
    assert {int(r["round"]) for r in rows if r["split"] == "val"} == {1, 2}
    assert {r["site"] for r in rows if r["split"] == "test" and r["metric"] == "dice-super"} == SITES | {"pooled"}
    pooled = {r["metric"]: float(r["value"]) for r in rows if r["split"] == "test" and r["site"] == "pooled"}
    # The untrained U-Net scores 0.088 pooled Dice on these images; the two rounds reach 0.147
    assert pooled["dice-super"] >= 0.12 and pooled["selector-accuracy"] >= 0.9, pooled
    last_val = {r["metric"]: float(r["value"]) for r in rows if r["split"] == "val" and r["site"] == "pooled"
                and r["round"] == "2"}
    assert pooled["gamma"] == last_val["gamma"]  # the test ran at the gamma validation chose
    summary = (folder / "summary.md").read_text()
    assert "| pooled |" in summary and "gamma chosen on validation" in summary
    assert (folder / "report.html").is_file() and (folder / "traffic.csv").is_file()
    _, info = load_bundle(folder / "super_model.pt")
    assert info.site_names == tuple(sorted(SITES))


SCAFFOLD = TINY + ' strategy="scaffold"'


@pytest.fixture(scope="module")
def scaffold_on_six_nodes(tmp_path_factory):
    """Two SCAFFOLD rounds, one node per site: its folder, metrics and grid (two tests read it)."""
    from support.in_process_grid import metrics_rows, only_run_folder, run_app

    root = tmp_path_factory.mktemp("scaffold")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDSM_SITE_STATE", str(root / "site-state"))
        grid = run_app(root / "runs", SCAFFOLD, 6)
    folder = only_run_folder(root / "runs")
    return folder, metrics_rows(folder), grid


def test_scaffold_keeps_control_variates_on_the_nodes_and_saves_the_global_model(scaffold_on_six_nodes):
    # Execute: two rounds, so the second uses the control variates the nodes kept
    folder, rows, grid = scaffold_on_six_nodes

    # Assert
    assert any("SCAFFOLD" in line for line in grid.log)
    # The grid notes what it sent without holding the messages: their weights would pile up over a long run
    assert {kind for kind, _ in grid.sent} >= {"train", "evaluate"}
    assert all(isinstance(kind, str) and isinstance(node, int) for kind, node in grid.sent)
    assert {r["metric"] for r in rows} == {"dice-global", "num-images", "num-empty"}
    assert {int(r["round"]) for r in rows if r["split"] == "val"} == {1, 2}
    assert (folder / "global_model.pt").exists() and not (folder / "super_model.pt").exists()
    assert "missed" not in (folder / "summary.md").read_text()


# FedSM-extra: one model round, then its selector rounds (the model rounds are FedSM's, tested above)
EXTRA = TINY.replace("num-server-rounds=2", "num-server-rounds=1") + ' strategy="fedsm-extra"'


@pytest.fixture(scope="module")
def fedsm_extra_short(tmp_path_factory):
    """A finished FedSM-extra run with one selector round: its folder, metrics, log and the sites' state."""
    from support.in_process_grid import metrics_rows, only_run_folder, run_app

    root = tmp_path_factory.mktemp("fedsm-extra")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDSM_SITE_STATE", str(root / "site-state"))
        grid = run_app(root / "runs", f"{EXTRA} extra-rounds=1", 6)
    folder = only_run_folder(root / "runs")
    return folder, metrics_rows(folder), grid.log, root / "site-state"


def test_fedsm_extra_trains_models_then_its_selector_and_saves_a_loadable_bundle(fedsm_extra_short):
    # Execute: 1 model round, then 1 selector round
    folder, rows, log, _ = fedsm_extra_short

    # Assert
    assert any("round 2 (extra)" in line for line in log)
    assert {int(r["round"]) for r in rows if r["split"] == "val"} == {1, 2}
    super_model, _ = load_bundle(folder / "super_model.pt")
    assert super_model.selector_includes_global
    assert super_model.selector(torch.rand(1, 3, 32, 32)).shape == (1, 7)


def test_a_federation_spec_of_png_sites_runs_on_two_nodes(tmp_path, in_process_app):
    # Arrange: two sites in the ProstateSlice layout and a spec with relative paths
    for index, name in enumerate(("north", "south")):
        write_slice_site(tmp_path / "data" / name, seed=index)
    spec = tmp_path / "federation.toml"
    spec.write_text("\n".join(f'[[sites]]\nname = "{n}"\nsource = "prostate-slices"\npath = "data/{n}"\n'
                              for n in ("north", "south")))

    # Execute: with kNN-Per at the test evaluation, on the global model and on the routed models
    folder, rows, _ = in_process_app(f"{TINY} dataset='{spec}' batch-size=2 knn-per=true knn-pixels-per-image=16",
                                     num_nodes=2)

    # Assert
    assert folder.name.endswith("-fedsm-federation")
    assert {r["site"] for r in rows if r["split"] == "test"} == {"north", "south", "pooled"}
    for metric in ("dice-knn-per", "dice-super-knn", "knn-lambda-super"):
        assert {r["site"] for r in rows if r["metric"] == metric} == {"north", "south", "pooled"}, metric
        assert {r["split"] for r in rows if r["metric"] == metric} == {"test"}, metric
    assert "dice-super-knn" in (folder / "summary.md").read_text()
    _, info = load_bundle(folder / "super_model.pt")
    assert info.site_names == ("north", "south")


def test_fedbn_with_harmofl_components_and_knn_per_saves_one_model_per_site(in_process_app):
    # Execute: round 1 fixes the global amplitude, round 2 trains with it; kNN-Per at the test evaluation
    folder, rows, grid = in_process_app(TINY + ' strategy="fedbn" amplitude-normalization=true '
                                        'weight-perturbation=true knn-per=true knn-pixels-per-image=16')

    # Assert
    assert any("merged into the global amplitude" in line for line in grid.log)
    knn = [r for r in rows if r["split"] == "test" and r["metric"] == "dice-knn-per"]
    assert {r["site"] for r in knn} >= SITES
    assert all(0.0 <= float(r["value"]) <= 1.0 for r in knn)
    assert not any(r["metric"] == "dice-knn-per" for r in rows if r["split"] == "val")
    saved = sorted(p.name for p in (folder / "site_models").iterdir())
    assert saved == [f"site-{i}.pt" for i in range(1, 7)]
    weights = [torch.load(folder / "site_models" / name, weights_only=True)["weights"] for name in saved]
    assert all(int(w["amplitude_norm.frozen"]) == 1 for w in weights)
    torch.testing.assert_close(weights[0]["amplitude_norm.amplitude"], weights[5]["amplitude_norm.amplitude"])


def test_two_nodes_serving_six_sites_give_the_same_metrics_as_six_nodes(in_process_app, scaffold_on_six_nodes):
    # Execute: SCAFFOLD keeps a control variate per site between rounds; with 2 nodes each serves 3 sites
    _, two, _ = in_process_app(SCAFFOLD, num_nodes=2, name="two")
    _, six, _ = scaffold_on_six_nodes

    # Assert
    assert two == six and {r["site"] for r in two if r["split"] == "test"} == SITES | {"pooled"}


def _assert_same_arrays(left, right, where: str) -> None:
    if isinstance(left, dict):
        assert set(left) == set(right), where
        for key in left:
            _assert_same_arrays(left[key], right[key], f"{where}/{key}")
    elif isinstance(left, np.ndarray):
        np.testing.assert_array_equal(left, right, err_msg=where)


def _assert_same_states(left: Path, right: Path, server_round: int) -> None:
    """Both run folders' checkpoints are from ``server_round`` and hold the same models, selector and optimizer."""
    a, b = load_checkpoint(left / CHECKPOINT_FILE), load_checkpoint(right / CHECKPOINT_FILE)
    assert a["round"] == b["round"] == server_round
    for key in ("global", "personalized", "selector", "selector-optimizer"):
        _assert_same_arrays(a["state"][key], b["state"][key], key)


def test_a_resumed_fedsm_run_ends_where_the_uninterrupted_run_ends(tiny_fedsm, in_process_app, monkeypatch,
                                                                   tmp_path):
    # Arrange: one round, interrupted there (tiny_fedsm.first); the sites' state from it
    assert load_checkpoint(tiny_fedsm.first / CHECKPOINT_FILE)["round"] == 1
    monkeypatch.setenv("FEDSM_SITE_STATE", str(tiny_fedsm.site_state(tmp_path)))

    # Execute: the resume for round 2
    resumed, resumed_rows, _ = in_process_app(f"{TINY} resume-from='{tiny_fedsm.first / CHECKPOINT_FILE}'")

    # Assert: the same state and the same numbers as the uninterrupted run, bit for bit
    _assert_same_states(resumed, tiny_fedsm.straight, 2)
    assert resumed_rows == tiny_fedsm.straight_rows


def test_a_resumed_run_with_kept_adam_state_and_server_momentum_ends_where_the_uninterrupted_run_ends(
        in_process_app):
    # Arrange: each site keeps its Adam state (at the site) and the server its momentum (in the checkpoint)
    kept = f"{TINY} strategy='fedavg' optimizer-state='local' server-optimizer='momentum' server-momentum=0.5"
    first, _, _ = in_process_app(kept.replace("num-server-rounds=2", "num-server-rounds=1"), name="first")

    # Execute: round 2 resumed from round 1, and two rounds straight
    resumed, resumed_rows, _ = in_process_app(f"{kept} resume-from='{first / CHECKPOINT_FILE}'", name="resumed")
    straight, straight_rows, _ = in_process_app(kept, name="straight")

    # Assert: the same model, server moments and numbers, bit for bit
    a, b = load_checkpoint(resumed / CHECKPOINT_FILE), load_checkpoint(straight / CHECKPOINT_FILE)
    _assert_same_arrays(a["state"]["global"], b["state"]["global"], "global")
    for key, moments in b["state"]["server-optimizer"].items():
        _assert_same_arrays(a["state"]["server-optimizer"][key], moments, key)
    assert resumed_rows == straight_rows


def test_a_resume_with_changed_settings_is_refused_naming_the_change(tiny_fedsm, in_process_app):
    with pytest.raises(ValueError, match=r"lr: 0.002 -> 0.01"):
        in_process_app(f"{TINY} lr=0.01 resume-from='{tiny_fedsm.first / CHECKPOINT_FILE}'")


def test_fedsm_extra_continued_with_more_extra_rounds_ends_where_a_run_of_that_length_ends(
        fedsm_extra_short, in_process_app, monkeypatch):
    # Arrange: a finished FedSM-extra run with one selector round (the tune's smaller candidate)
    short, _, _, site_state = fedsm_extra_short
    monkeypatch.setenv("FEDSM_SITE_STATE", str(site_state))

    # Execute: continue it to two selector rounds, and run two selector rounds straight
    grown, grown_rows, _ = in_process_app(f"{EXTRA} extra-rounds=2 resume-from='{short / CHECKPOINT_FILE}'",
                                          name="grown")
    straight, straight_rows, _ = in_process_app(f"{EXTRA} extra-rounds=2", name="straight")

    # Assert: the same models and selector, and the same validation and test scores in the last round
    _assert_same_states(grown, straight, 3)
    last = {(r["split"], r["site"], r["metric"]): r["value"] for r in straight_rows if r["round"] == "3"}
    grown_last = {(r["split"], r["site"], r["metric"]): r["value"] for r in grown_rows if r["round"] == "3"}
    assert ("val", "pooled", "dice-super") in last and grown_last == last
