"""The studies' progress bar over runs."""

from __future__ import annotations

from experiments.progress import over_runs


def test_runs_come_through_in_order_and_the_bar_counts_them_on_stderr(capsys):
    jobs = [("fedsm", 0), ("fedsm", 1), ("fedsm-extra", 0)]

    seen = list(over_runs(jobs, "study"))

    captured = capsys.readouterr()
    assert seen == jobs
    assert "study" in captured.err and "3/3" in captured.err and "run" in captured.err
    assert captured.out == ""  # tables printed on stdout stay clean
