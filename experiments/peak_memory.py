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
import subprocess
import sys
import time

import psutil


def _new_process_rss(since: float, own_pid: int) -> tuple[int, int]:
    """Summed RSS (bytes) and count of processes created at or after ``since``."""
    total = count = 0
    for process in psutil.process_iter(["pid", "create_time", "memory_info"]):
        info = process.info
        if info["pid"] == own_pid or info["create_time"] is None or info["memory_info"] is None:
            continue
        if info["create_time"] >= since - 0.5:
            total += info["memory_info"].rss
            count += 1
    return total, count


def measure(command: list[str], interval: float) -> dict[str, float]:
    """Run ``command``; return exit code, wall seconds and peak summed RSS in GiB."""
    started = time.time()
    child = subprocess.Popen(command)
    peak = peak_count = 0
    while child.poll() is None:
        rss, count = _new_process_rss(started, psutil.Process().pid)
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
