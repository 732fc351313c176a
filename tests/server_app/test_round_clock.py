"""The ServerApp's per-round log line: elapsed time and the estimate of the time left."""

from __future__ import annotations

import pytest

from fedsm_core.report import run_data
from server_app import run_folder, traffic
from server_app.round_clock import RoundClock, format_duration


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_time_left_is_the_mean_round_so_far_times_the_rounds_left():
    # Prepare: rounds 1..5, two rounds done after 20 s
    clock = _Clock()
    rounds = RoundClock(1, 5, clock)
    clock.now += 20.0

    # Execute / Assert: 10 s per round, 3 rounds left
    assert rounds.remaining(2) == pytest.approx(30.0)
    assert rounds.line(2) == "round 2/5 done: 20s elapsed, about 30s left"


def test_a_resumed_run_counts_only_the_rounds_of_this_process():
    clock = _Clock()
    rounds = RoundClock(4, 10, clock)  # resumed after round 3
    clock.now += 60.0

    assert rounds.remaining(5) == pytest.approx(150.0)  # 2 rounds in 60 s, 5 left


def test_bad_rounds_are_refused():
    RoundClock(5, 4)  # no round to run: a run that only finishes its checkpoint of round 4
    with pytest.raises(ValueError, match="before the first round"):
        RoundClock(6, 4)
    with pytest.raises(ValueError, match="round 2 is before the first round 3"):
        RoundClock(3, 6, _Clock()).remaining(2)


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0s"), (42, "42s"), (185, "3m05s"), (3725, "1h02m")])
def test_durations_are_short(seconds, text):
    assert format_duration(seconds) == text


def test_the_report_reads_the_files_the_server_writes():
    assert run_data.METRICS_FILE == run_folder.METRICS_FILE
    assert run_data.SUMMARY_FILE == run_folder.SUMMARY_FILE
    assert (run_data.TRAFFIC_FILE, run_data.TIMING_FILE) == (traffic.TRAFFIC_FILE, traffic.TIMING_FILE)
