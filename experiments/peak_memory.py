"""Run a command and report its wall time and the peak memory of everything it started.

Usage::

    python -m experiments.peak_memory -- bash scripts/run-simulation.sh

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
import time
from pathlib import Path

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


def _new_process_rss(since: float, own_pid: int) -> tuple[int, int]:
    """Summed RSS (bytes) and count of processes started at or after ``since`` (Linux /proc)."""
    boot = _boot_time()
    total = count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own_pid:
            continue
        found = _process_start_and_rss(entry, boot)
        if found is not None and found[0] >= since - 1.0:
            total += found[1]
            count += 1
    return total, count


def measure(command: list[str], interval: float) -> dict[str, float]:
    """Run ``command``; return exit code, wall seconds and peak summed RSS in GiB."""
    started = time.time()
    child = subprocess.Popen(command)
    peak = peak_count = 0
    while child.poll() is None:
        rss, count = _new_process_rss(started, os.getpid())
        if rss > peak:
            peak, peak_count = rss, count
        time.sleep(interval)
    return {
        "exit_code": child.returncode,
        "wall_seconds": round(time.time() - started, 1),
        "peak_rss_gib": round(peak / 2**30, 3),
        "processes_at_peak": peak_count,
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given; usage: python -m experiments.peak_memory -- COMMAND ...")
    result = measure(command, args.interval)
    print(json.dumps(result))
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
