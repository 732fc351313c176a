"""Whole-run test helpers: the tiny run's settings, its run folder and its metrics.

The in-process Grid itself (the real ServerApp against the real ClientApps, no
SuperLink) lives in :mod:`experiments.in_process_app`, which the robustness
study runs on too.
"""

from __future__ import annotations

import csv
from pathlib import Path

from experiments.in_process_app import InProcessGrid, run_app, run_config_of

__all__ = ["TINY", "InProcessGrid", "metrics_rows", "only_run_folder", "run_app", "run_config_of"]

# Two FedSM rounds on tiny generated sites: what the whole-run tests train (seconds, not minutes). Without final
# fine-tuning: the resume tests continue its one-round run, and the fine-tuning tests ask for it themselves.
TINY = ("num-server-rounds=2 max-local-steps=2 image-size=32 data-scale=0.1 selector-width=8 eval-every=1 "
        "fine-tune-passes=0")


def only_run_folder(runs: Path) -> Path:
    """The one run folder under ``runs``."""
    folders = list(runs.iterdir())
    assert len(folders) == 1, folders
    return folders[0]


def metrics_rows(folder: Path) -> list[dict[str, str]]:
    """The run's ``metrics.csv``."""
    with (folder / "metrics.csv").open() as handle:
        return list(csv.DictReader(handle))
