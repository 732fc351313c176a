"""The run report: reading a run folder, its tables and figures, and the page, from a synthetic run."""

from __future__ import annotations

import re

import numpy as np
import pytest
from support.report_fixtures import SITES, metric_rows, write_run_folder

from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.command_line.cli import main
from fedsm_core.report.report_plots import chosen_gamma, cost_per_round, plot_gamma, pooled_sweep
from fedsm_core.report.run_data import RunData, load_run
from fedsm_core.report.run_report import REPORT_FILE, ROUTING_TABLE_ID, routing_matrix, write_report
from fedsm_core.run_files.checkpoint import save_checkpoint


def _images_of(page: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', page)


def test_load_run_reads_typed_rows_sites_and_the_summary_settings(tmp_path):
    # Prepare
    folder = write_run_folder(tmp_path / "run")

    # Execute
    run = load_run(folder)

    # Assert
    assert run.sites == SITES  # no checkpoint: the sites in metrics.csv order, without "pooled"
    assert run.settings == {"strategy": "fedsm", "dataset": "synthetic-fundus", "num-server-rounds": "2"}
    assert run.split_rounds("val") == [1, 2] and run.finished
    assert run.curve("val", "site-2", "dice-super") == ([1, 2], [pytest.approx(0.61), pytest.approx(0.81)])
    assert run.values("test")["site-1"]["num-routed-0"] == 3.0


def test_a_folder_that_is_not_a_run_folder_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither metrics.csv nor checkpoint.pt"):
        load_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nowhere")


def test_fedsm_report_on_a_bad_folder_exits_1_with_the_reason(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 1
    assert "is not a run folder" in capsys.readouterr().err


def test_routing_matrix_cells_hold_count_and_dice_and_a_total_row(tmp_path):
    # Prepare
    run = load_run(write_run_folder(tmp_path / "run"))

    # Execute
    header, rows = routing_matrix(run)

    # Assert
    assert header == ["true site \\ routed to", "global", "site-1", "site-2"]
    assert rows[0][0] == "site-1"
    assert ">1 &middot; 0.600<" in rows[0][1] and ">3 &middot; 0.800<" in rows[0][2] and ">0<" in rows[0][3]
    assert 'class="own"' in rows[0][2] and 'class="own"' in rows[1][3]  # the diagonal: own personalized model
    assert ">1<" in rows[1][2]  # misrouted image without foreground: a count, no Dice
    assert rows[2] == ["<b>all sites</b>", "1", "4", "2"]  # 1 + 0, 3 + 1, 0 + 2


def test_no_routing_matrix_without_routed_counts(tmp_path):
    run = load_run(write_run_folder(tmp_path / "run", with_test=False))

    assert routing_matrix(run) is None
    assert not run.finished


def test_cost_per_round_sums_both_directions_per_stage_and_takes_round_seconds(tmp_path):
    run = load_run(write_run_folder(tmp_path / "run"))

    rounds, megabytes, seconds = cost_per_round(run)

    # round r: 2 sites x 2 directions x r MB per stage
    assert rounds == [1, 2]
    assert megabytes == {"evaluate": [4.0, 8.0], "train": [4.0, 8.0]}
    assert seconds == [5.0, 7.5]  # the "round" part only, not its "train" part


def _swept_run(tmp_path, gamma_values: dict[str, float]) -> RunData:
    rows = [{"round": 2, "split": "val", "site": site, "metric": "gamma", "value": gamma}
            for site, gamma in gamma_values.items()]
    sweeps = {"site-1": {"dice-super-sweep": [0.2] * len(GAMMA_GRID)},
              "site-2": {"dice-super-sweep": [0.8] * len(GAMMA_GRID)}}
    return RunData(tmp_path, {}, SITES, rows, sweeps=sweeps, sweep_counts={"site-1": 3.0, "site-2": 1.0})


def test_pooled_sweep_weights_sites_by_their_images_with_foreground(tmp_path):
    run = _swept_run(tmp_path, {"site-1": 0.3, "site-2": 0.3})

    # (0.2 * 3 + 0.8 * 1) / 4 = 0.35 at every gamma
    assert pooled_sweep(run) == pytest.approx([0.35] * len(GAMMA_GRID))


def test_chosen_gamma_is_one_value_or_one_per_model(tmp_path):
    assert chosen_gamma(_swept_run(tmp_path, {"site-1": 0.3, "site-2": 0.3})) == 0.3
    assert chosen_gamma(_swept_run(tmp_path, {"site-1": 0.3, "site-2": 1.0})) == (0.3, 1.0)


def test_gamma_plot_needs_a_sweep_over_the_whole_grid(tmp_path):
    run = _swept_run(tmp_path, {"site-1": 0.3, "site-2": 0.3})

    assert plot_gamma(run, tmp_path / "gamma.png", GAMMA_GRID) == tmp_path / "gamma.png"
    assert (tmp_path / "gamma.png").stat().st_size > 0
    assert plot_gamma(run, tmp_path / "short.png", GAMMA_GRID[:3]) is None


def test_report_of_a_finished_run_has_every_figure_and_the_routing_table(tmp_path):
    # Prepare
    folder = write_run_folder(tmp_path / "run")
    (folder / "overlays").mkdir()
    from matplotlib.figure import Figure
    Figure(figsize=(1, 1)).savefig(folder / "overlays" / "site-1.png")

    # Execute
    path = write_report(folder)

    # Assert
    page = path.read_text()
    assert path == folder / REPORT_FILE
    assert f'<table id="{ROUTING_TABLE_ID}">' in page
    images = _images_of(page)
    assert {"report/validation.png", "report/test.png", "report/cost.png", "overlays/site-1.png"} <= set(images)
    assert all((folder / image).is_file() for image in images)
    assert "wrote them into the run folder" in page  # simulation: overlays beside the report
    assert "http" not in page.replace("http-equiv", "")  # nothing fetched from the network


def test_report_of_an_unfinished_run_from_its_checkpoint_alone(tmp_path):
    # Prepare: only a checkpoint after round 2 of 5, with the validation sweeps of round 2
    folder = tmp_path / "run"
    folder.mkdir()
    sweeps = {site: {"dice-super-sweep": [float(v) for v in np.linspace(0.3, 0.6, len(GAMMA_GRID))]}
              for site in SITES}
    state = {"latest-lists": {"val": sweeps}, "last-counts": {"site-1": 4.0, "site-2": 4.0}, "missed": []}
    save_checkpoint(folder / "checkpoint.pt", 2, {"strategy": "fedsm", "dataset": "x", "num-server-rounds": 5},
                    SITES, "FedSM", state, [r for r in metric_rows(with_test=False)])

    # Execute: the checkpoint file itself names the run
    path = write_report(folder / "checkpoint.pt")

    # Assert
    page = path.read_text()
    assert "unfinished: last evaluated round 2" in page and "fedsm on x, 5 rounds" in page
    assert "report/gamma.png" in _images_of(page) and (folder / "report" / "gamma.png").is_file()
    assert "No routes recorded" in page and "No test evaluation yet" in page
    assert "overlay-dir" in page  # where a deployment's sites keep their overlays


def test_a_baseline_run_is_drawn_and_named(tmp_path):
    folder = write_run_folder(tmp_path / "run")
    baseline = write_run_folder(tmp_path / "centralized")

    page = write_report(folder, baseline).read_text()

    assert "baseline run centralized" in page


def test_the_test_section_labels_slice_dice_and_adds_a_case_table_only_with_cases(tmp_path):
    # Prepare: the fixture's run (no cases), and the same run whose sites report per-case scores
    plain = write_run_folder(tmp_path / "plain")
    cases = write_run_folder(tmp_path / "cases")
    rows = [(2, "test", "site-1", "num-cases", 2.0), (2, "test", "site-1", "case-dice-super", 0.7),
            (2, "test", "site-1", "case-hd95-super", 3.5), (2, "test", "site-1", "num-missed-cases-super", 0.0)]
    with (cases / "metrics.csv").open("a") as handle:
        handle.writelines(",".join(str(cell) for cell in row) + "\n" for row in rows)

    # Execute
    without, with_cases = write_report(plain).read_text(), write_report(cases).read_text()

    # Assert
    assert "Slice Dice (paper)" in without and "Per case (3-D)" not in without
    assert "Per-case 3-D Dice" in with_cases
    assert "<th>case-dice-super</th><th>case-hd95-super</th>" in with_cases and "<td>3.5000</td>" in with_cases
