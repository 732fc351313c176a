"""Settings checked before a run starts: ``check_run``, ``fedsm check-config``, the ServerApp and the script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fedsm_core.command_line.cli import main
from fedsm_core.command_line.preflight import check_run, parse_run_config_overrides

ROOT = Path(__file__).resolve().parents[2]


def spec_file(tmp_path: Path, sites: dict[str, str | None]) -> Path:
    text = ""
    for name, path in sites.items():
        text += f'[[sites]]\nname = "{name}"\nsource = "prostate-slices"\n' + (f'path = "{path}"\n' if path else "")
    spec = tmp_path / "fed.toml"
    spec.write_text(text)
    return spec


def test_default_settings_pass_and_name_the_six_sites():
    result = check_run({})

    assert result.ok
    assert result.site_names == tuple(f"site-{k}" for k in range(1, 7))


def test_softpull_lambda_below_one_over_k_is_found_before_the_run():
    # K = 6: 1/K = 0.1667 > 0.1; a held-out site leaves K = 5 and 1/K = 0.2
    assert "[0.1667, 1] for K = 6" in check_run({"softpull-lambda": 0.1}).problems[0]
    assert "for K = 5" in check_run({"softpull-lambda": 0.19, "held-out-site": "site-2"}).problems[0]
    assert check_run({"softpull-lambda": 0.1, "strategy": "fedavg"}).ok  # no SoftPull runs


def test_server_optimizer_settings_are_checked_before_the_run():
    problems = check_run({"server-optimizer": "adagrad", "server-beta1": 2.0}).problems
    assert len(problems) == 1 and "server-optimizer = 'adagrad' is not one of" in problems[0]
    assert "server-beta1 = 2.0 is outside" in check_run({"server-optimizer": "adam", "server-beta1": 2.0}).problems[0]
    assert check_run({"server-optimizer": "momentum", "server-lr": 0.5, "server-momentum": 0.9}).ok


def test_a_missing_spec_and_an_unknown_held_out_site_are_problems():
    assert "no federation spec found" in check_run({"dataset": "no/such/spec.toml"}).problems[0]
    assert "held-out-site = 'nope' is not a site" in check_run({"held-out-site": "nope"}).problems[0]


def test_data_folders_of_a_spec_must_exist_except_the_held_out_sites(tmp_path):
    (tmp_path / "A").mkdir()
    spec = spec_file(tmp_path, {"A": "A", "B": "missing-B", "C": "missing-C", "D": None})

    problems = check_run({"dataset": str(spec), "held-out-site": "C"}, require_paths=True).problems

    assert len(problems) == 2
    assert "site 'B'" in problems[0] and "missing-B does not exist" in problems[0]
    assert "site 'D'" in problems[1] and "has no 'path'" in problems[1]
    assert check_run({"dataset": str(spec), "held-out-site": "C"}).problems == (problems[0],)  # deployment


def test_min_replies_and_the_resume_file_are_checked(tmp_path):
    problems = check_run({"min-replies": 7, "resume-from": str(tmp_path / "none.pt")}).problems

    assert len(problems) == 2
    assert any("resume-from" in p and "does not exist" in p for p in problems)
    assert any("min-replies = 7 is more than the 6 sites" in p for p in problems)


def test_run_config_overrides_are_read_as_flwr_reads_them():
    assert parse_run_config_overrides("lr=0.01 dataset='a b.toml' knn-per=true num-server-rounds=3") == {
        "lr": 0.01, "dataset": "a b.toml", "knn-per": True, "num-server-rounds": 3}
    with pytest.raises(ValueError, match="not key=value"):
        parse_run_config_overrides("lr")


def test_check_config_exits_one_listing_every_problem(capsys):
    status = main(["check-config", "--app", str(ROOT), "--run-config", "softpull-lambda=0.1 min-replies=9"])

    err = capsys.readouterr().err
    assert status == 1
    assert "softpull-lambda = 0.1" in err and "min-replies = 9" in err


def test_check_config_prints_the_number_of_sites_for_scripts(capsys):
    assert main(["check-config", "--app", str(ROOT), "--print-num-sites",
                 "--run-config", "dataset='synthetic-fundus-4'"]) == 0
    assert capsys.readouterr().out.strip() == "4"


class UntouchedGrid:
    """A Grid that fails the test when the ServerApp uses it."""

    def __getattr__(self, name):
        raise AssertionError(f"the ServerApp used the grid ({name}) before checking its settings")


def test_the_server_app_refuses_bad_settings_before_making_a_run_folder_or_asking_nodes(tmp_path):
    from flwr.app import Context, RecordDict

    from server_app.app import main as server_main

    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={"softpull-lambda": 0.1, "output-dir": str(tmp_path / "runs")})

    with pytest.raises(ValueError, match="softpull-lambda = 0.1 .* K = 6"):
        server_main(UntouchedGrid(), context)
    assert not (tmp_path / "runs").exists()


def test_run_simulation_stops_before_flwr_on_bad_settings(tmp_path):
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr"), "FEDSM_RUNS": str(tmp_path / "runs"),
           "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    fake = tmp_path / "bin" / "flwr"  # records any call: there must be none
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho called >> {tmp_path / 'flwr-called'}\n")
    fake.chmod(0o755)

    result = subprocess.run(["bash", str(ROOT / "scripts" / "run-simulation.sh"), "softpull-lambda=0.1"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    assert result.returncode == 2
    assert "softpull-lambda = 0.1" in result.stderr and "nothing was started" in result.stderr
    assert not (tmp_path / "flwr-called").exists()
