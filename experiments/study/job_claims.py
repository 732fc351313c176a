"""Several sittings of one study at once: each claims a run before training it, under a file lock.

A study (:mod:`experiments.study.run_plan`) may run in several processes that
share one ``--out`` folder, e.g. two sittings with ``--launcher in-process`` on
a 2-core machine, each training one run on one core. Each sitting walks the
pending runs in plan order and trains the first one it can claim:

- a run is claimed by an exclusive, non-blocking ``flock`` on
  ``<runs>/.claims/<digest>.lock`` (:func:`experiments.sittings.locked`), held
  until the run's rows are written; a run another sitting holds is passed over;
- a run that takes its rounds from another (``rounds-from``) waits until that
  one has finished; while it waits the sitting trains other runs, and when
  nothing else is left it polls until the other sitting finishes;
- a run that finished meanwhile (another sitting trained it) is skipped.

The writes every sitting makes to the shared folder (``results.csv``,
``table.md``, ``run-configs.jsonl``, ``commands.md``) go under the folder's lock
(:func:`folder_lock`). One sitting alone claims every run in plan order, as
before. ``flwr run`` sittings should not overlap: two local Ray clusters on one
machine compete for the same cores and ports.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from experiments.sittings import locked
from experiments.study.runs import RunKey

CLAIMS = ".claims"
FOLDER_LOCK = ".study.lock"
POLL_SECONDS = 60.0  # between looks while every run left is another sitting's
Job = tuple[RunKey, dict[str, object], RunKey | None]


def claim_file(runs: Path, key: RunKey) -> Path:
    """The lock file whose holder trains ``key``."""
    return runs / CLAIMS / f"{key.dataset_label}-{key.method}-seed{key.seed}-{key.digest}.lock"


def folder_lock(out: Path) -> contextlib.AbstractContextManager[bool]:
    """The lock every sitting takes to write the study's shared files in ``out``."""
    return locked(out / FOLDER_LOCK)


def claim_jobs(pending: Sequence[Job], runs: Path, finished: Callable[[RunKey], bool],
               poll_seconds: float | None = None, say: Callable[[str], None] = print) -> Iterator[Job]:
    """Yield each run of ``pending`` this sitting claims, holding its claim until the caller asks for the next.

    Parameters
    ----------
    pending : sequence of Job
        The runs to train, in plan order (a run's ``rounds-from`` source comes before it).
    runs : Path
        The study's run folders (the claims live in ``runs/.claims``).
    finished : callable
        Whether a run has finished (its rows are on disk or in ``results.csv``), asked afresh each time.
    poll_seconds : float, optional
        How long to wait before looking again when every run left is held by
        another sitting or waits for a run that another sitting trains
        (:data:`POLL_SECONDS` when not given).
    say : callable
        Where the waiting is reported.
    """
    left = list(pending)
    wait = POLL_SECONDS if poll_seconds is None else poll_seconds
    while left:
        claimed = False
        for job in list(left):
            key, _, source = job
            if finished(key):
                left.remove(job)
                continue
            if source is not None and not finished(source):
                continue  # its source trains first (here, earlier in `left`, or in another sitting)
            with locked(claim_file(runs, key), wait=False) as mine:
                if mine and not finished(key):
                    left.remove(job)
                    claimed = True
                    yield job
                    break
                if mine:
                    left.remove(job)
        if left and not claimed:
            say(f"[study] waiting {wait:.0f} s: {len(left)} run(s) left, held by another sitting or "
                f"waiting for a run it trains ({', '.join(str(job[0]) for job in left[:3])}"
                f"{', ...' if len(left) > 3 else ''})")
            time.sleep(wait)
