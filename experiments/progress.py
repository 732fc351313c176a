"""A progress bar over the runs of a study: how many are done, and about how long the rest will take.

tqdm comes with segmentation-models-pytorch (through huggingface-hub), a
dependency of the app, so nothing is added. The bar goes to stderr, so a
study's printed tables on stdout stay clean; each study's own ``[study] ...``
lines still report every finished run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

Job = TypeVar("Job")


def over_runs(jobs: Iterable[Job], label: str, total: int | None = None, done: int = 0) -> Iterator[Job]:
    """``jobs`` as they come, with a tqdm bar counting runs (``label`` names the study).

    Parameters
    ----------
    jobs : iterable
        One item per run (a seed, a ``(method, seed)`` pair, a site).
    total : int, optional
        Number of runs when ``jobs`` has no length (a generator), or of the whole study
        when ``jobs`` are only the runs left.
    done : int
        Runs finished before (a resumed study): the bar starts there, and its time
        estimate counts only the runs of this sitting.
    """
    yield from tqdm(jobs, desc=label, total=total, initial=done, unit="run", file=sys.stderr, dynamic_ncols=True,
                    mininterval=1.0)
