"""The generalization-gap ladder: its FedAvg round is the app's, cells resume exactly, the table reads its CSV."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from client_app import app as client
from experiments.ladder import loops as ladder_loops
from experiments.ladder import run_ladder as ladder
from experiments.ladder.table import read_cells
from experiments.study.speed_table import rounds_to
from fedsm_core.algorithms.server_optimizer import ServerOptimizer
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import training_dataset
from fedsm_core.data.statistics import channel_statistics
from fedsm_core.models.weights import get_weights
from server_app.discovery import SiteNode
from server_app.strategies.builder import Setup, build_strategy

TINY = {"image-size": 32, "data-scale": 0.1, "max-local-steps": 2, "selector-width": 4, "batch-size": 4,
        "eval-every": 1}
TINY_TEXT = " ".join(f"{key}={value}" for key, value in TINY.items())


pytestmark = [pytest.mark.usefixtures("client_process"), pytest.mark.long_module(seconds=90)]


def _app_fedavg(settings: dict[str, object], rounds: int):
    """FedAvg rounds of the app: the strategy's messages, each answered by the ClientApp's handler."""
    config = RunConfig.from_mapping(settings)
    sites = ladder_loops.load_sites(config)
    info = training_dataset(config.dataset)
    spec = config.model_spec(len(info.structures), info.num_sites)
    nodes = [SiteNode(100 + index, index, site.name, len(site.train), len(site.val), len(site.test),
                      channel_statistics(site.train.images)) for index, site in enumerate(sites)]
    strategy, _ = build_strategy(Setup(config, info, spec, nodes, lambda *args: None))
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config=settings)
    for server_round in range(1, rounds + 1):
        replies = [client.train(message, context) for message in strategy.configure_train(server_round)]
        strategy.aggregate_train(server_round, replies)
    return strategy.global_weights


@pytest.mark.parametrize("server", [{}, {"server-optimizer": "adam", "server-lr": 0.01, "step-normalization": "fednova",
                                         "site-weighting": "equal", "optimizer-state": "local", "aggregation": "mean"},
                                    {"strategy": "fedprox", "proximal-mu": 0.1, "style-augmentation": 0.5},
                                    {"strategy": "scaffold", "optimizer-state": "averaged"}],
                         ids=["fedavg", "fednova-fedadam-local-adam", "fedprox", "scaffold-averaged-adam"])
def test_the_ladders_single_model_rounds_on_the_real_sites_are_the_apps_bit_for_bit(server):
    # Prepare: SCAFFOLD's second round also depends on the control variates of the first
    settings = {**TINY, "strategy": "fedavg", "num-server-rounds": 2, **server}
    config = RunConfig.from_mapping(settings)
    sites = ladder_loops.load_sites(config)
    spec = config.model_spec(sites[0].train.masks.shape[1], len(sites))
    torch.manual_seed(config.seed)
    weights = get_weights(spec.build_segmentation())
    start = dict(weights)

    # Execute
    optimizer, state = ServerOptimizer(config.server_settings, config.aggregation_settings), \
        ladder_loops.round_state(spec)
    for server_round in (1, 2):
        weights = ladder_loops.fedavg_round(weights, sites, spec, config, server_round, torch.device("cpu"),
                                            optimizer, state)
    app = _app_fedavg(settings, 2)

    # Assert
    assert weights.keys() == app.keys()
    for key in weights:
        np.testing.assert_array_equal(weights[key], app[key], err_msg=key)
    assert any(not np.array_equal(start[k], v) for k, v in weights.items())


def test_averaged_adam_state_over_one_site_is_that_sites_kept_state():
    # Prepare: one site, so the average of the replied states is the site's own
    weights = {}
    for mode in ("local", "averaged"):
        config = RunConfig.from_mapping({**TINY, "strategy": "fedavg", "optimizer-state": mode})
        sites = ladder_loops.load_sites(config)[:1]
        spec = config.model_spec(sites[0].train.masks.shape[1], 1)
        torch.manual_seed(0)
        current, state = get_weights(spec.build_segmentation()), ladder_loops.round_state(spec)
        optimizer = ServerOptimizer(config.server_settings)

        # Execute
        for server_round in (1, 2, 3):
            current = ladder_loops.fedavg_round(current, sites, spec, config, server_round, torch.device("cpu"),
                                                optimizer, state)
        weights[mode] = current

    # Assert
    for key, value in weights["local"].items():
        np.testing.assert_array_equal(weights["averaged"][key], value, err_msg=key)


@pytest.mark.parametrize(("method", "kept"), [("fedavg", {"optimizer-state": "local", "server-optimizer": "momentum",
                                                        "server-momentum": 0.5}),
                                              ("scaffold", {}), ("fedsm", {})],
                         ids=["fedavg-kept-state", "scaffold", "fedsm"])
def test_an_interrupted_cell_ends_where_the_uninterrupted_one_ends(tmp_path, method, kept):
    # Prepare: with kept state, the sites' Adam states and the server's momentum must survive the interruption
    def config(rounds: int) -> RunConfig:
        return ladder.cell_config("synthetic-fundus", 0, rounds, {**TINY, **kept}, method)

    # Execute: two rounds at once; one round, then the same cell asked for two
    whole = ladder_loops.run_cell(config(2), method, "iid", tmp_path / "whole")
    ladder_loops.run_cell(config(1), method, "iid", tmp_path / "parts")
    resumed = ladder_loops.run_cell(config(2), method, "iid", tmp_path / "parts")

    # Assert
    assert resumed.curves == whole.curves and resumed.tests == whole.tests
    assert set(whole.tests) == ({"global", "super"} if method == "fedsm" else {"global"})


def test_a_ladder_writes_every_cell_once_and_a_second_call_trains_nothing(tmp_path, monkeypatch):
    # Execute
    args = ["--out", str(tmp_path), "--datasets", "synthetic-fundus", "--methods", "fedavg", "--rounds", "2",
            "--run-config", TINY_TEXT]
    assert ladder.main(args) == 0
    monkeypatch.setattr(ladder, "run_cell", lambda *a: pytest.fail("a finished cell was trained again"))
    assert ladder.main(args) == 0

    # Assert: centralized and three rungs, each with its two evaluated rounds and a test row per site
    cells = read_cells(tmp_path / "results.csv")["synthetic-fundus"][0]
    assert set(cells) == {("centralized", "pooled", "global"), *(("fedavg", rung, "global")
                                                                 for rung in ("one-site", "iid", "real"))}
    for cell in cells.values():
        assert [r for r, _ in cell["curve"]] == [1, 2]
        assert len(cell["test"]) == 7  # six sites and pooled
    table = (tmp_path / "table.md").read_text()
    assert table.count("| fedavg |") == 3 and "| centralized | pooled | global |" in table
    assert (tmp_path / "commands.md").read_text().count("cells finished at the start") == 2


def test_rounds_to_target_is_the_first_evaluated_round_that_reaches_it():
    curve = [(10, 0.80), (5, 0.70), (15, 0.905), (20, 0.90)]
    assert rounds_to(curve, 0.90) == 15
    assert rounds_to(curve, 0.80) == 10
    assert rounds_to(curve, 0.95) is None


def test_a_variant_adds_its_own_rows_and_a_cell_another_sitting_holds_is_skipped(tmp_path, monkeypatch):
    # Prepare: the centralized reference is finished; another sitting holds the variant's iid cell
    trained = []
    monkeypatch.setattr(ladder, "run_cell", lambda config, method, rung, folder: trained.append(
        (method, rung, config.optimizer_state)) or _fake_result())
    common = ["--out", str(tmp_path), "--datasets", "synthetic-fundus", "--methods", "fedavg", "--rounds", "2",
              "--run-config", TINY_TEXT]
    assert ladder.main([*common, "--rungs", "real"]) == 0
    held = tmp_path / "runs" / "synthetic-fundus-fedavg:local-iid-0.lock"

    # Execute
    with ladder.locked(held):
        assert ladder.main([*common, "--rungs", "iid", "real", "--variant", "local",
                            "--variant-config", "optimizer-state='local'"]) == 0

    # Assert: the variant's real cell ran with its setting; centralized and the held cell did not run again
    assert trained == [("centralized", "pooled", "reset"), ("fedavg", "real", "reset"), ("fedavg", "real", "local")]
    methods = {key[0] for key in read_cells(tmp_path / "results.csv")["synthetic-fundus"][0]}
    assert methods == {"centralized", "fedavg", "fedavg:local"}
    assert "| fedavg:local | real | global |" in (tmp_path / "table.md").read_text()


def test_a_variant_of_centralized_training_also_trains_centralized_with_it(tmp_path, monkeypatch):
    # Prepare
    trained = []
    monkeypatch.setattr(ladder, "run_cell", lambda config, method, rung, folder: trained.append(
        (method, rung, config.style_augmentation, config.strategy)) or _fake_result())

    # Execute
    assert ladder.main(["--out", str(tmp_path), "--datasets", "synthetic-fundus", "--methods", "fedprox", "--rounds",
                        "2", "--run-config", TINY_TEXT, "--rungs", "real", "--variant", "style", "--variant-config",
                        "style-augmentation=0.5", "--centralized-variant"]) == 0

    # Assert: plain centralized stays the reference; centralized:style and fedprox:style get the setting
    assert trained == [("centralized", "pooled", 0.0, "fedavg"), ("centralized", "pooled", 0.5, "fedavg"),
                       ("fedprox", "real", 0.5, "fedprox")]
    assert "| centralized:style | pooled | global |" in (tmp_path / "table.md").read_text()


def _fake_result() -> ladder_loops.CellResult:
    return ladder_loops.CellResult({"global": [(1, 0.5), (2, 0.6)]}, {"global": {"site-1": 0.7, "pooled": 0.7}}, 1.0)


def test_the_committed_ladder_table_regenerates_byte_for_byte(tmp_path):
    # Prepare
    folder = Path(__file__).resolve().parents[3] / "experiments" / "results" / "ladder"
    if not (folder / "results.csv").is_file():
        pytest.skip(f"{folder} holds no results.csv yet")

    # Execute: the command commands.md names
    out = tmp_path / "table.md"
    subprocess.run([sys.executable, "-m", "experiments.ladder.table", "--csv", str(folder / "results.csv"),
                    "--out", str(out)], cwd=folder.parents[2], check=True)

    # Assert
    assert out.read_bytes() == (folder / "table.md").read_bytes()
    assert "python -m experiments.ladder.table" in (folder / "commands.md").read_text()


def test_the_cells_of_a_federation_spec_have_their_own_folders_and_locks():
    spec = "experiments/federations/drishti-six-site.toml"
    folders = {ladder.cell_folder(Path("out"), (spec, "fedavg", rung, 0)) for rung in ("one-site", "iid", "real")}
    assert len({folder.parent / f"{folder.name}.lock" for folder in folders}) == 3
    assert all(folder.parent == Path("out/runs") for folder in folders)
