"""Run folders as the ServerApp leaves them, for the study tools that read them (compare, tune)."""

from __future__ import annotations

import csv

from fedsm_core.config import RunConfig
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, save_checkpoint
from fedsm_core.run_files.run_outputs import CSV_COLUMNS


def fake_run_folder(runs, name: str, server_round: int, settings: dict, tested: bool, score: float = 0.5):
    """A run folder as the ServerApp leaves it: a checkpoint at ``server_round``, and test rows if ``tested``."""
    folder = runs / name
    folder.mkdir(parents=True)
    config = RunConfig.from_mapping(settings)
    save_checkpoint(folder / CHECKPOINT_FILE, server_round, config.to_mapping(), ["site-1"], config.strategy, {}, [])
    metric = "dice-super" if config.strategy.startswith("fedsm") else "dice-global"
    rows = [(server_round, "val", "pooled", metric, score)] + \
        ([(server_round, "test", "pooled", metric, 0.6)] if tested else [])
    with (folder / "metrics.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([CSV_COLUMNS, *rows])
    return folder
