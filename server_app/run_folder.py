"""The folder a run writes to, and what goes into it."""

from __future__ import annotations

import time
from logging import INFO
from pathlib import Path

from flwr.common import log

from fedsm_core.config import RunConfig
from fedsm_core.run_files.run_outputs import MetricsLog, pool_site_metrics

METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.md"


def create_run_folder(config: RunConfig) -> Path:
    """``<output-dir>/<time>-<strategy>-<dataset>``, made absolute and unique.

    A relative ``output-dir`` is taken from the ServerApp's working directory,
    which is the SuperLink's; the run scripts pass an absolute path.
    """
    base = Path(config.output_dir).expanduser().resolve()
    dataset = Path(config.dataset).stem if config.dataset.endswith(".toml") else config.dataset
    without = f"-without-{config.held_out_site}" if config.held_out_site else ""
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{config.strategy}-{dataset}{without}"
    for suffix in range(1000):
        folder = base / (stem if suffix == 0 else f"{stem}-{suffix}")
        try:
            folder.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            continue
        return folder
    raise RuntimeError(f"could not create a new run folder under {base}")


class ProgressReporter:
    """Writes evaluation rounds to the metrics CSV and logs a one-line progress report."""

    def __init__(self, folder: Path, num_rounds: int) -> None:
        self.metrics = MetricsLog(folder / METRICS_FILE)
        self.num_rounds = num_rounds
        self.started = time.monotonic()
        self.latest: dict[str, dict[str, dict[str, float]]] = {}

    def __call__(self, server_round: int, split: str, per_site: dict[str, dict[str, float]]) -> None:
        """Record one evaluation's per-site metrics and print its progress line."""
        pooled = self.metrics.add(server_round, split, per_site)
        self.latest[split] = per_site
        elapsed = time.monotonic() - self.started
        log(
            INFO,
            "[%s round %d/%d, %.0f s] pooled Dice global %.4f | personalized %.4f | super %.4f | "
            "selector accuracy %.3f",
            split, server_round, self.num_rounds, elapsed,
            pooled.get("dice-global", float("nan")), pooled.get("dice-personal", float("nan")),
            pooled.get("dice-super", float("nan")), pooled.get("selector-accuracy", float("nan")),
        )

    def pooled(self, split: str) -> dict[str, float]:
        """Pooled metrics of the latest evaluation of ``split``."""
        return pool_site_metrics(self.latest.get(split, {}))
