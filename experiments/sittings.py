"""What every resumable study shares: a file lock per cell and per CSV, and the log of its sittings.

A study (the ladder, the robustness study) is run in sittings: each skips the
cells already in its CSV, so an interrupted study goes on where it stopped.
Several sittings may share one output folder at once: each takes a cell's lock
before training it, and appends to the CSV under the folder's lock.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

# Settings whose default changed after a study's committed cells were measured. Each study puts these under its
# own overrides, so a later sitting's cells are measured like the committed ones (a variant may still override).
# The defaults changed after these cells: gamma-selection became "client-average", input-norm "per-image",
# fine-tune-passes 30 (experiments.ladder.final_fine_tuning re-scores the ladder's FedSM checkpoints with it).
MEASURED_WITH = {"gamma-selection": "validation", "input-norm": "none",
                 "fine-tune-passes": 0}


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
        handle.write(f"- {stamp}, commit {commit}: {done} of {total} cells finished at the start; "
                     f"`{' '.join(argv)}`\n")
