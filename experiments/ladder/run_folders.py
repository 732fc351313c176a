r"""FedSM runs of the app (a study's cells, any ``flwr run``) as re-scorable federations.

The ladder's re-scorers (:mod:`experiments.ladder.gamma_rules`,
:mod:`experiments.ladder.final_fine_tuning`) read the ladder's own cell
checkpoints. With ``--run-folders`` they read finished app runs instead::

    python -m experiments.ladder.final_fine_tuning --out experiments/results/reference-defaults \
        --run-folders experiments/results/reference-defaults/runs/synthetic-prostate/fedsm-softpull/seed0-*/2026* \
        --max-passes 30 --on-validation

Each folder's ``checkpoint.pt`` (written after every round) gives the run
config, the global model, SoftPull's personalized models and the selector;
the sites are loaded from that run config as the ClientApps load them and the
selector head is fitted as the run fitted it before each evaluation. A run
whose personalized models were fine-tuned after its last round
(``fine-tune-passes`` > 0) is refused: the re-scorers compare SoftPull's
models with fine-tuned ones, so they need a run with ``fine-tune-passes = 0``
(the study's method ``fedsm-softpull`` trains exactly that).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from experiments import in_process
from experiments.ladder.loops import fedsm_federation, load_sites
from experiments.runner import append_rows, read_rows
from fedsm_core.config import RunConfig
from fedsm_core.device import select_device
from fedsm_core.methods import METHODS
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, load_checkpoint


def run_label(config: RunConfig, folder: Path) -> str:
    """The ``method`` column of a run folder's rows: its strategy and the folder's name."""
    return f"{config.strategy}@{folder.name}"


def read_run(folder: Path) -> tuple[RunConfig, dict]:
    """The run config and the checkpoint of the run in ``folder``."""
    checkpoint = load_checkpoint(folder / CHECKPOINT_FILE)
    return RunConfig.from_mapping(checkpoint["run-config"]), checkpoint


def load_run_folder(folder: Path, config: RunConfig, checkpoint: dict) -> in_process.Federation:
    """The finished FedSM run in ``folder`` (read by :func:`read_run`) as a federation, selector head fitted.

    Raises
    ------
    ValueError
        When the run is not FedSM, has not reached its last round, or fine-tuned its personalized models.
    """
    row = METHODS[config.strategy]
    if row.family != "fedsm" or row.extra_selector:
        raise ValueError(f"{folder}: strategy = '{config.strategy}'; the re-scorers read FedSM runs "
                         f"(strategy 'fedsm'); pass a FedSM run folder")
    if checkpoint["round"] < config.num_server_rounds:
        raise ValueError(f"{folder}: the checkpoint is at round {checkpoint['round']} of "
                         f"{config.num_server_rounds}; let the run finish (or resume it) first")
    state = checkpoint["state"]
    if state.get("fine-tuned") is not None:
        raise ValueError(f"{folder}: its personalized models were fine-tuned after the last round "
                         f"(fine-tune-passes = {config.fine_tune_passes}); re-score a run with "
                         f"fine-tune-passes = 0 (the study's method fedsm-softpull)")
    federation = fedsm_federation(config, load_sites(config), select_device(config.device))
    federation.fedsm.global_weights = state["global"]
    federation.fedsm.personalized = dict(state["personalized"])
    federation.fedsm.selector_weights = state["selector"]
    in_process.fit_selector_head(federation)
    return federation


def rescore_run_folders(args: argparse.Namespace, name: str, columns: tuple[str, ...],
                        score: Callable[[in_process.Federation], list[tuple]]) -> None:
    """Append ``score(federation)``'s rows of every run folder not yet in ``<out>/<name>.csv``.

    A row starts with the run's dataset, :func:`run_label` and seed.
    """
    csv_path = args.out / f"{name}.csv"
    done = {(r["dataset"], r["method"], int(r["seed"])) for r in read_rows(csv_path)}
    for folder in args.run_folders:
        config, checkpoint = read_run(folder)
        cell = (config.dataset, run_label(config, folder), config.seed)
        if cell in done:
            continue
        federation = load_run_folder(folder, config, checkpoint)
        append_rows(csv_path, columns, [(*cell, *row) for row in score(federation)])
        print(f"[{name}] {folder}: re-scored", flush=True)
