"""What every resumable study shares: a file lock per cell and per CSV, the log of its sittings, cell configs.

A study (the ladder, the robustness study) is run in sittings: each skips the
cells already in its CSV, so an interrupted study goes on where it stopped.
Several sittings may share one output folder at once: each takes a cell's lock
before training it, and appends to the CSV under the folder's lock.

A cell is a tuple whose last field is its seed; its table averages a cell over
seeds. So each finished cell's whole run config is recorded
(``cell-configs.jsonl``), and a sitting refuses, before anything trains, to
add a seed to cells that ran with another config (a default changed since):
:func:`check_cell_configs`. Cells finished before configs were recorded are
not checked; :data:`MEASURED_WITH` pins the defaults that changed after them.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path

import torch

from experiments.runner import append_rows
from experiments.study.run_configs import differences
from fedsm_core.config import RunConfig

CELL_CONFIGS = "cell-configs.jsonl"
# Not compared between the seeds of a cell: the seeds themselves, and where and how a run executes.
PER_RUN_KEYS = frozenset({"seed", "data-seed", "output-dir", "resume-from", "device", "torch-threads",
                          "round-timeout", "min-replies"})

# Settings whose default changed after a study's committed cells were measured. Each study puts these under its
# own overrides, so a later sitting's cells are measured like the committed ones (a variant may still override).
# The defaults changed after these cells: gamma-selection became "client-average", input-norm "per-image",
# fine-tune-passes 30 (experiments.ladder.final_fine_tuning re-scores the ladder's FedSM checkpoints with it),
# aggregation "filtered-mean" (the robustness study names its aggregation in every cell).
MEASURED_WITH = {"gamma-selection": "validation", "input-norm": "none",
                 "fine-tune-passes": 0, "aggregation": "mean"}


@contextlib.contextmanager
def locked(path: Path, wait: bool = True):
    """An exclusive ``flock`` on ``path`` (created), so sittings in several processes can share one folder.

    Yields whether the lock was taken (always, when ``wait``).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def describe_machine(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The machine a sitting runs on, for its log: host name, CPU model and logical CPUs.

    The same code and seeds can give other numbers on another CPU (its kernels sum in another
    order), so each sitting says where it ran.
    """
    model = platform.processor() or "CPU model unknown"
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        model = names[0] if names else model
    return f"{platform.node()} ({model}, {os.cpu_count()} CPUs)"


def fingerprint_packages() -> str:
    """A short hash of every installed package's name and version, for a log of sittings.

    Two sittings with the same fingerprint ran on the same package versions; a changed one says the
    environment changed between them (a rebuilt virtual environment can resolve newer versions of the
    packages that generate the data or run the model), without listing a few hundred versions per line.
    """
    names = sorted({f"{d.metadata['Name'].lower()}=={d.version}" for d in metadata.distributions()
                    if d.metadata["Name"]})
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:10]


def log_sitting(out: Path, study: str, table: str, argv: list[str], done: int, total: int) -> None:
    """Append this sitting and its command to ``out/commands.md`` (the commands and versions on the first write).

    Parameters
    ----------
    study, table : str
        The study's module and its table's module (``python -m <module>``).
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / "commands.md"
    if not path.exists():
        path.write_text("# Commands\n\nRun, or continue after an interruption (finished cells are skipped):\n\n"
                        f"    python -m {study} {' '.join(argv)}\n\n"
                        "The table from the CSV alone:\n\n"
                        f"    python -m {table} --csv {out}/results.csv --out {out}/table.md\n\n"
                        "## Versions\n\n"
                        f"- python {platform.python_version()}\n- torch {torch.__version__}\n"
                        f"- flwr {metadata.version('flwr')}\n\n## Sittings\n\n")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with path.open("a") as handle:
        handle.write(f"- {stamp}, commit {commit}, {describe_machine()}, packages {fingerprint_packages()}: "
                     f"{done} of {total} cells finished at the start; `{' '.join(argv)}`\n")


def comparable_config(settings: Mapping[str, object]) -> dict[str, object]:
    """The run config ``settings`` resolve to (defaults filled in) as JSON values, without :data:`PER_RUN_KEYS`."""
    resolved = RunConfig.from_mapping(settings).to_mapping()
    kept = {key: value for key, value in resolved.items() if key not in PER_RUN_KEYS}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def read_cell_configs(out: Path) -> dict[tuple, dict[str, object]]:
    """``out/cell-configs.jsonl`` as {cell: its recorded config}; empty before the first cell finished."""
    path = out / CELL_CONFIGS
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {tuple(record["cell"]): record["config"] for record in records}


def record_cell_config(out: Path, cell: tuple, settings: Mapping[str, object]) -> None:
    """Append a finished cell's config (call it under the folder's results lock, as the CSV is written)."""
    with (out / CELL_CONFIGS).open("a") as handle:
        handle.write(json.dumps({"cell": list(cell), "config": comparable_config(settings)}, sort_keys=True) + "\n")


def record_finished_cell(csv_path: Path, columns: Sequence[str], cell: tuple, rows: Sequence[tuple],
                         settings: Mapping[str, object], write_table: Callable[[], None]) -> None:
    """Append a finished cell's rows (each prefixed by the cell) and its config, then rewrite the table.

    All under the folder's results lock, so sittings sharing the folder never interleave their rows, and a
    cell's rows and its recorded config land together.
    """
    with locked(csv_path.parent / "results.lock"):
        record_cell_config(csv_path.parent, cell, settings)
        append_rows(csv_path, tuple(columns), [(*cell, *row) for row in rows])
        write_table()


def check_cell_configs(out: Path, planned: Mapping[tuple, Mapping[str, object]]) -> None:
    """Refuse a sitting whose cells would join seeds of the same cell recorded with another run config.

    ``planned`` maps each cell of the sitting to its settings. A recorded cell
    is compared with every planned cell that differs from it in the seed (the
    last field) alone, itself included.

    Raises
    ------
    ValueError
        Naming each such cell, the seed it ran with and the keys that differ.
    """
    records = read_cell_configs(out)
    problems = []
    for cell, settings in planned.items():
        today = comparable_config(settings)
        for other, recorded in records.items():
            changed = differences(recorded, today) if list(other[:-1]) == list(cell[:-1]) else []
            if changed:
                problems.append(f"  {' '.join(map(str, cell))}: seed {other[-1]} ran with {'; '.join(changed)}")
    if problems:
        raise ValueError(f"{out}: these cells would sit beside seeds measured with another run config (recorded -> "
                         f"this sitting), in {CELL_CONFIGS}:\n" + "\n".join(sorted(set(problems))) +
                         "\npin the recorded values with --run-config (or in MEASURED_WITH, experiments/sittings.py) "
                         "to extend those cells, or name the change as a new variant")
