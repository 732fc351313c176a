"""The peak-memory sampler counts the processes that carry its marker, and only those."""

from __future__ import annotations

import os
import subprocess
import sys

from experiments.bench.peak_memory import PeakMemory

HOLD = "x = bytearray(300 * 2**20); x[::4096] = b'1' * len(x[::4096]); import time; time.sleep(1.5)"


def _child(marker_value: str) -> None:
    env = {**os.environ, "PEAK_TEST": marker_value}
    subprocess.run([sys.executable, "-c", HOLD], env=env, check=True)


def test_a_marked_child_is_counted():
    with PeakMemory(interval=0.1, marker="PEAK_TEST=mine") as peak:
        _child("mine")
    assert peak.gib >= 0.29 and peak.processes >= 1


def test_a_process_without_the_marker_is_not_counted():
    with PeakMemory(interval=0.1, marker="PEAK_TEST=mine") as peak:
        _child("someone-else")
    assert peak.peak_bytes == 0 and peak.processes == 0


def test_the_peak_keeps_each_process_with_its_pss_and_anonymous_memory():
    with PeakMemory(interval=0.1, marker="PEAK_TEST=mine") as peak:
        _child("mine")

    child = max(peak.at_peak, key=lambda p: p.anon)
    assert child.role == "other" and child.anon >= 290 * 2**20  # the 300 MiB bytearray is anonymous memory
    assert peak.pss_gib >= 0.28 and peak.pss_gib <= peak.gib + 0.01
