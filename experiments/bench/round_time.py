"""Seconds per FedSM training round in one process: the compute a study pays per round, without Flower.

Usage::

    python -m experiments.bench.round_time --out experiments/results/bench-round-time/after.csv \
        --rounds 4 --repeats 2 --run-config image-size=64 dataset=synthetic-fundus

Each repeat prepares a fresh federation (:func:`experiments.in_process.prepare`)
and times :func:`experiments.in_process.train_round` for rounds 1..R: every
site's local training (global, personalized and selector steps) and the
server's aggregation, nothing else. Round 1 also pays one-off start-up costs,
so the summary line reports the mean over rounds 2..R of all repeats. Rows
``(label, repeat, round, seconds, cpu_seconds)`` are appended to ``--out``
(wall seconds, and this process's CPU seconds, which another job sharing the
machine disturbs less); compare two commits by running the same command at
each, alternating, with another ``--label``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from experiments import in_process
from experiments.runner import append_rows, parse_overrides
from fedsm_core.config import RunConfig

COLUMNS = ("label", "repeat", "round", "seconds", "cpu_seconds")
DEFAULTS = {"dataset": "synthetic-fundus", "image-size": 64, "device": "cpu", "torch-threads": 1}


def time_rounds(settings: dict[str, object], rounds: int) -> list[tuple[float, float]]:
    """Wall and CPU seconds of each of ``rounds`` training rounds of a fresh in-process federation."""
    config = RunConfig.from_mapping({**DEFAULTS, **settings, "num-server-rounds": rounds})
    federation = in_process.prepare(config)
    seconds = []
    for server_round in range(1, rounds + 1):
        start, cpu = time.perf_counter(), time.process_time()
        in_process.train_round(federation, server_round)
        seconds.append((time.perf_counter() - start, time.process_time() - cpu))
    return seconds


def append_times(path: Path, rows: list[tuple[str, int, int, float, float]]) -> None:
    """Append ``(label, repeat, round, seconds, cpu_seconds)`` rows to the CSV at ``path``, to the millisecond."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_rows(path, COLUMNS, [(label, repeat, number, f"{seconds:.3f}", f"{cpu:.3f}")
                                for label, repeat, number, seconds, cpu in rows])


def steady_mean(rows: list[tuple[str, int, int, float, float]], column: int = 3) -> float:
    """Mean of ``column`` (3: wall seconds, 4: CPU seconds) over rounds 2 and later.

    Round 1 carries one-off start-up costs.
    """
    later = [row[column] for row in rows if row[2] > 1]
    if not later:
        raise ValueError("--rounds must be at least 2: round 1 alone includes start-up costs")
    return statistics.fmean(later)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="CSV to append rows to")
    parser.add_argument("--label", default="run", help="names this code version in the rows")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--run-config", nargs="*", default=[], help="key=value overrides (kebab-case keys)")
    args = parser.parse_args(argv)
    settings = parse_overrides(" ".join(args.run_config))
    rows = []
    for repeat in range(args.repeats):
        seconds = time_rounds(settings, args.rounds)
        rows += [(args.label, repeat, index + 1, wall, cpu) for index, (wall, cpu) in enumerate(seconds)]
        print(f"[round-time] {args.label} repeat {repeat}: "
              + " ".join(f"{wall:.2f} ({cpu:.2f} CPU)" for wall, cpu in seconds), flush=True)
    append_times(args.out, rows)
    print(f"[round-time] {args.label}: {steady_mean(rows):.2f} s per round, {steady_mean(rows, 4):.2f} CPU s "
          f"(rounds 2-{args.rounds}, {args.repeats} repeat(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
