"""What the resumable studies share: each finished cell's run config is recorded, and seeds never mix configs."""

from __future__ import annotations

import json
import os
import platform

import pytest

from experiments.ladder import run_ladder as ladder
from experiments.ladder.loops import CellResult
from experiments.sittings import (
    CELL_CONFIGS,
    check_cell_configs,
    comparable_config,
    describe_machine,
    fingerprint_packages,
    read_cell_configs,
    record_finished_cell,
)
from fedsm_core.config import RunConfig

TINY = "image-size=32 data-scale=0.1 max-local-steps=2 selector-width=4 batch-size=4 eval-every=1"


def _record(out, cell, settings) -> None:
    with (out / CELL_CONFIGS).open("a") as handle:
        handle.write(json.dumps({"cell": list(cell), "config": comparable_config(settings)}) + "\n")


def test_a_seed_is_refused_beside_seeds_recorded_with_another_config_and_only_there(tmp_path):
    # Prepare: seed 0 of two cells recorded with lr 0.002 (the default); today's sitting runs lr 0.001
    base = {"dataset": "synthetic-fundus", "strategy": "fedavg"}
    _record(tmp_path, ("synthetic-fundus", "fedavg", "real", 0), {**base, "seed": 0, "data-seed": 0})
    _record(tmp_path, ("synthetic-fundus", "fedavg", "iid", 0), {**base, "seed": 0, "data-seed": 0})
    changed = {**base, "lr": 0.001, "seed": 1, "data-seed": 1}

    # Execute / Assert: the same cell on seed 1 is refused, naming the seed, the key and both values
    with pytest.raises(ValueError, match=r"synthetic-fundus fedavg real 1: seed 0 ran with lr: 0\.002 -> 0\.001\n"
                                         r".*pin the recorded values"):
        check_cell_configs(tmp_path, {("synthetic-fundus", "fedavg", "real", 1): changed})
    # another seed with the recorded config passes (seeds differ by design), and so does another cell
    check_cell_configs(tmp_path, {("synthetic-fundus", "fedavg", "real", 1): {**base, "seed": 1, "data-seed": 1}})
    check_cell_configs(tmp_path, {("synthetic-fundus", "fedavg:lr", "real", 1): changed})
    check_cell_configs(tmp_path / "empty", {("synthetic-fundus", "fedavg", "real", 1): changed})


def test_the_ladder_records_each_finished_cell_and_refuses_to_extend_it_after_a_default_changed(tmp_path,
                                                                                                  monkeypatch):
    # Prepare: cells that finish at once (no training), with the config they were given
    given = []

    def fake_cell(config, method, rung, folder):
        given.append(config)
        return CellResult({"global": [(2, 0.5)]}, {"global": {"site-1": 0.5, "pooled": 0.5}}, 1.0)

    monkeypatch.setattr(ladder, "run_cell", fake_cell)
    args = ["--out", str(tmp_path), "--datasets", "synthetic-fundus", "--methods", "fedavg", "--rungs", "real",
            "--rounds", "2", "--run-config", TINY]

    # Execute: seed 0, then a record edited as a changed default would leave it, then seed 1
    ladder.main([*args, "--seeds", "0"])
    records = read_cell_configs(tmp_path)
    assert records[("synthetic-fundus", "fedavg", "real", 0)] == comparable_config(given[1].to_mapping())
    assert set(records) == {("synthetic-fundus", "centralized", "pooled", 0), ("synthetic-fundus", "fedavg", "real", 0)}
    lines = (tmp_path / CELL_CONFIGS).read_text().replace('"softpull-lambda": 0.99', '"softpull-lambda": 0.5')
    (tmp_path / CELL_CONFIGS).write_text(lines)

    # Assert: seed 1 is refused for both cells before anything trains
    with pytest.raises(ValueError, match=r"(?s)centralized pooled 1: seed 0 ran with softpull-lambda: 0\.5 -> 0\.99"
                                         r".*fedavg real 1: seed 0 ran with softpull-lambda"):
        ladder.main([*args, "--seeds", "1"])
    assert len(given) == 2
    assert RunConfig().softpull_lambda == 0.99  # the value the edit stands in for


def test_a_finished_cell_writes_its_rows_config_and_table_together(tmp_path):
    # Prepare: two cells of a study whose rows are (kind, site, value); the table counts the CSV's lines
    csv_path = tmp_path / "results.csv"
    tables = []

    def write_table() -> None:
        tables.append(len(csv_path.read_text().splitlines()))

    settings = {"dataset": "synthetic-fundus", "strategy": "fedavg", "seed": 0, "data-seed": 0}

    # Execute
    record_finished_cell(csv_path, ("dataset", "seed", "kind", "site", "value"), ("synthetic-fundus", 0),
                         [("test", "site-1", 0.123456789), ("seconds", "", 2.0)], settings, write_table)
    record_finished_cell(csv_path, ("dataset", "seed", "kind", "site", "value"), ("synthetic-fundus", 1),
                         [("test", "site-1", 0.5)], {**settings, "seed": 1}, write_table)

    # Assert: one header, each row prefixed by its cell, values with 6 decimals; the table saw every row so far
    assert csv_path.read_text().splitlines() == [
        "dataset,seed,kind,site,value", "synthetic-fundus,0,test,site-1,0.123457",
        "synthetic-fundus,0,seconds,,2.000000", "synthetic-fundus,1,test,site-1,0.500000"]
    assert tables == [3, 4]
    assert set(read_cell_configs(tmp_path)) == {("synthetic-fundus", 0), ("synthetic-fundus", 1)}


def test_the_machine_is_named_with_its_cpu_model_and_count(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\n"
                       "processor\t: 1\nmodel name\t: Example CPU 9000\n")
    described = describe_machine(cpuinfo)
    assert described == f"{platform.node()} (Example CPU 9000, {os.cpu_count()} CPUs)"
    assert "Example" not in describe_machine(tmp_path / "missing")  # another system: platform's own name


def test_the_package_fingerprint_is_stable_and_changes_with_a_version(monkeypatch):
    # Prepare: a stand-in for the installed distributions
    class Distribution:
        def __init__(self, name, version):
            self.metadata, self.version = {"Name": name}, version

    installed = [Distribution("torch", "2.14.1"), Distribution("Pillow", "13.0.0")]
    monkeypatch.setattr("experiments.sittings.metadata.distributions", lambda: list(installed))

    # Execute
    first = fingerprint_packages()
    installed.reverse()
    reordered = fingerprint_packages()
    installed[0] = Distribution("Pillow", "12.2.0")
    changed = fingerprint_packages()

    # Assert: ten hex digits, independent of order, different after one package's version changed
    assert len(first) == 10 and int(first, 16) >= 0
    assert reordered == first and changed != first
