"""The in-process round timer: rows it writes, the steady-state mean, and a real two-round timing."""

from __future__ import annotations

import csv

import pytest

from experiments.bench.round_time import append_times, main, steady_mean

TINY = ["dataset='synthetic-fundus-2'", "image-size=32", "data-scale=0.1", "max-local-steps=1",
        "selector-width=4", "batch-size=4"]


def test_steady_mean_leaves_out_the_first_round_and_needs_a_second():
    rows = [("a", 0, 1, 9.0, 8.0), ("a", 0, 2, 2.0, 1.0), ("a", 1, 1, 7.0, 6.0), ("a", 1, 2, 4.0, 2.0)]
    assert steady_mean(rows) == pytest.approx(3.0)  # (2 + 4) / 2; the 9 s and 7 s first rounds are start-up
    assert steady_mean(rows, 4) == pytest.approx(1.5)  # CPU seconds: (1 + 2) / 2
    with pytest.raises(ValueError, match="--rounds must be at least 2"):
        steady_mean(rows[:1])


def test_rows_are_appended_under_one_header(tmp_path):
    path = tmp_path / "times.csv"
    append_times(path, [("before", 0, 1, 1.23456, 1.0)])
    append_times(path, [("after", 0, 1, 0.5, 0.25)])
    rows = list(csv.reader(path.open()))
    assert rows == [["label", "repeat", "round", "seconds", "cpu_seconds"], ["before", "0", "1", "1.235", "1.000"],
                    ["after", "0", "1", "0.500", "0.250"]]


def test_the_command_times_every_round_of_every_repeat(tmp_path, capsys):
    out = tmp_path / "times.csv"
    assert main(["--out", str(out), "--label", "tiny", "--rounds", "2", "--repeats", "1", "--run-config", *TINY]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["label"], r["repeat"], r["round"]) for r in rows] == [("tiny", "0", "1"), ("tiny", "0", "2")]
    assert all(float(r["seconds"]) > 0 and float(r["cpu_seconds"]) > 0 for r in rows)
    assert "CPU s (rounds 2-2, 1 repeat(s))" in capsys.readouterr().out
