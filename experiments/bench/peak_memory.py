"""Run a command and report its wall time and the peak memory of everything it started.

Usage::

    python -m experiments.bench.peak_memory -- bash scripts/run-simulation.sh

Flower's local SuperLink is started detached and Ray starts its own workers, so
the usual ``maxrss`` of the child misses most of the memory. This samples, every
``--interval`` seconds, the summed resident memory (RSS) of all processes that
were started after the command and reports the largest sum seen. Run it on an
otherwise idle machine: any unrelated process started meanwhile is counted too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Self

from experiments.bench.process_memory import ProcessMemory, read_process_memory

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime"):
            return float(line.split()[1])
    raise RuntimeError("/proc/stat has no btime line; this tool needs Linux /proc")


def _process_start_and_rss(pid: str, boot: float) -> tuple[float, int] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        statm = Path(f"/proc/{pid}/statm").read_text()
    except OSError:  # the process ended while we looked
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return boot + int(fields[19]) / CLOCK_TICKS, int(statm.split()[1]) * PAGE_SIZE


def _has_marker(pid: str, marker: str) -> bool:
    """Whether process ``pid`` has ``marker`` (``NAME=value``) in its environment."""
    try:
        return marker.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # ended, or another user's process
        return False


def _marked_processes(since: float, own_pid: int, marker: str | None = None) -> dict[int, int]:
    """RSS (bytes) by PID of the processes started at or after ``since`` (Linux /proc).

    With ``marker`` (``NAME=value``), only processes whose environment holds it
    are counted: a run's processes inherit it, unrelated ones do not.
    """
    boot = _boot_time()
    found_rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own_pid:
            continue
        found = _process_start_and_rss(entry, boot)
        if found is not None and found[0] >= since - 1.0 and (marker is None or _has_marker(entry, marker)):
            found_rss[int(entry)] = found[1]
    return found_rss


class PeakMemory:
    """Samples, in a background thread, the summed RSS of processes started after it began.

    At the sample with the largest sum it also reads each counted process's
    role, RSS, PSS and anonymous memory (:func:`~experiments.bench.process_memory.read_process_memory`),
    a moment after the sum itself; a process that ends in between is left out
    of those figures but not of the sum.

    Use as a context manager around any code that starts processes::

        with PeakMemory(marker="BENCH_TAG=run-3") as peak:
            subprocess.run(command, env={**os.environ, "BENCH_TAG": "run-3"})
        peak.gib, peak.processes, peak.pss_gib, peak.at_peak

    Parameters
    ----------
    interval : float
        Seconds between samples.
    marker : str, optional
        ``NAME=value`` that the processes to count carry in their environment
        (see :func:`_marked_processes`); without it, every process started
        meanwhile counts, unrelated ones too.
    """

    def __init__(self, interval: float = 0.5, marker: str | None = None) -> None:
        self.interval = interval
        self.marker = marker
        self.peak_bytes = 0
        self.processes = 0
        self.at_peak: list[ProcessMemory] = []
        self._started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @property
    def gib(self) -> float:
        """The peak summed RSS in GiB."""
        return round(self.peak_bytes / 2**30, 3)

    @property
    def pss_gib(self) -> float:
        """Summed PSS in GiB of the processes read at the peak (shared pages split between their users)."""
        return round(sum(p.pss for p in self.at_peak) / 2**30, 3)

    def _sample(self) -> None:
        while True:
            rss = _marked_processes(self._started, os.getpid(), self.marker)
            if sum(rss.values()) > self.peak_bytes:
                self.peak_bytes, self.processes = sum(rss.values()), len(rss)
                # smaps_rollup walks every mapping, costlier than statm: read it only at a new peak
                self.at_peak = [m for m in map(read_process_memory, rss) if m is not None]
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Self:
        self._started = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(command: list[str], interval: float) -> dict[str, float]:
    """Run ``command``; return exit code, wall seconds and peak summed RSS in GiB."""
    started = time.time()
    with PeakMemory(interval) as peak:
        returncode = subprocess.run(command, check=False).returncode
    return {
        "exit_code": returncode,
        "wall_seconds": round(time.time() - started, 1),
        "peak_rss_gib": peak.gib,
        "processes_at_peak": peak.processes,
        "peak_pss_gib": peak.pss_gib,
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given; usage: python -m experiments.bench.peak_memory -- COMMAND ...")
    result = measure(command, args.interval)
    print(json.dumps(result))
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
