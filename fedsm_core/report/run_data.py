"""What a run report shows, read from a run folder or from the checkpoint of an unfinished run.

A finished run folder holds ``metrics.csv``, ``traffic.csv``, ``timing.csv``,
``summary.md`` and ``checkpoint.pt``; an interrupted one at least
``metrics.csv`` or ``checkpoint.pt``. The checkpoint adds what the CSV files
lack: the run config, the site list and the last validation round's gamma
sweeps (``latest-lists``), which the Dice-against-gamma plot needs.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# File names of a run folder. server_app.run_folder and server_app.traffic write them; the core
# may not import the Flower adapters, so the names are repeated here (a test checks they agree).
METRICS_FILE = "metrics.csv"
TRAFFIC_FILE = "traffic.csv"
TIMING_FILE = "timing.csv"
SUMMARY_FILE = "summary.md"
CHECKPOINT_FILE = "checkpoint.pt"
OVERLAY_FOLDER = "overlays"
POOLED = "pooled"


@dataclasses.dataclass(frozen=True)
class RunData:
    """Everything the report shows about one run.

    Attributes
    ----------
    folder : Path
        The run folder; the report and its PNGs are written into it.
    settings : dict
        The run config (key -> value), empty when neither the checkpoint nor
        ``summary.md`` was found.
    sites : tuple of str
        The federation's sites in their order (personalized model ``k`` is ``sites[k]``).
    metrics : list of dict
        ``metrics.csv`` rows: ``round`` (int), ``split``, ``site``, ``metric``, ``value`` (float).
    traffic, timing : list of dict
        ``traffic.csv`` and ``timing.csv`` rows (numbers as floats); empty for an unfinished run.
    sweeps : dict
        Site -> list metric (``dice-super-sweep``, ...) of the last validation round.
    sweep_counts : dict
        Site -> images with foreground behind its sweep (its weight when pooling).
    finished : bool
        Whether the run got to its test evaluation.
    """

    folder: Path
    settings: dict[str, Any]
    sites: tuple[str, ...]
    metrics: list[dict[str, Any]]
    traffic: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    timing: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sweeps: dict[str, dict[str, list[float]]] = dataclasses.field(default_factory=dict)
    sweep_counts: dict[str, float] = dataclasses.field(default_factory=dict)
    finished: bool = False

    def split_rounds(self, split: str) -> list[int]:
        """The rounds with rows of ``split``, ascending."""
        return sorted({row["round"] for row in self.metrics if row["split"] == split})

    def values(self, split: str, server_round: int | None = None) -> dict[str, dict[str, float]]:
        """Site (and ``pooled``) -> metric -> value of ``split`` in ``server_round`` (default: the latest)."""
        rounds = self.split_rounds(split)
        if not rounds:
            return {}
        wanted = rounds[-1] if server_round is None else server_round
        table: dict[str, dict[str, float]] = {}
        for row in self.metrics:
            if row["split"] == split and row["round"] == wanted:
                table.setdefault(row["site"], {})[row["metric"]] = row["value"]
        return table

    def curve(self, split: str, site: str, metric: str) -> tuple[list[int], list[float]]:
        """``(rounds, values)`` of one metric at one site (or ``pooled``) over the rounds of ``split``."""
        points = sorted((row["round"], row["value"]) for row in self.metrics
                        if row["split"] == split and row["site"] == site and row["metric"] == metric
                        and not math.isnan(row["value"]))
        return [r for r, _ in points], [v for _, v in points]

    @property
    def site_columns(self) -> list[str]:
        """Sites that have metrics, in federation order, then any others (a held-out site)."""
        seen = [row["site"] for row in self.metrics if row["site"] != POOLED]
        ordered = [site for site in self.sites if site in seen]
        return ordered + sorted(set(seen) - set(ordered))


def read_csv_rows(path: Path, numeric: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of a CSV file as dicts, the ``numeric`` columns as floats (``round`` as int)."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        for key in numeric:
            if key in row and row[key] not in (None, ""):
                row[key] = int(row[key]) if key == "round" else float(row[key])
    return rows


def metrics_from_rows(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The checkpoint's metric tuples ``(round, split, site, metric, value)`` as dict rows."""
    return [{"round": int(r), "split": str(split), "site": str(site), "metric": str(metric), "value": float(value)}
            for r, split, site, metric, value in rows]


def settings_from_summary(path: Path) -> dict[str, str]:
    """The ``## Settings`` table of ``summary.md`` (values as text); empty when it has none."""
    settings: dict[str, str] = {}
    inside = False
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            inside = line.strip() == "## Settings"
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if inside and len(cells) == 2 and cells[0] not in ("key", "---"):
            settings[cells[0]] = cells[1]
    return settings


def _checkpoint_parts(path: Path) -> dict[str, Any]:
    """The report's part of a checkpoint: config, sites, metric rows and the validation sweeps."""
    from fedsm_core.run_files.checkpoint import load_checkpoint  # torch import only when a checkpoint is read

    state = load_checkpoint(path)
    lists = state["state"].get("latest-lists", {}).get("val", {})
    return {
        "settings": dict(state["run-config"]),
        "sites": tuple(state["sites"]),
        "metrics": metrics_from_rows(state["metrics"]),
        "sweeps": {site: {k: [float(x) for x in v] for k, v in values.items()} for site, values in lists.items()},
        "sweep_counts": {site: float(n) for site, n in state["state"].get("last-counts", {}).items()},
    }


def load_run(path: str | Path) -> RunData:
    """Read a run folder, or a checkpoint file (its folder is the run folder).

    Raises
    ------
    FileNotFoundError
        When the path does not exist, or the folder holds neither ``metrics.csv``
        nor ``checkpoint.pt`` (the message says what a run folder contains).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"report: '{path}' does not exist; pass a run folder (runs/<time>-<strategy>-"
                                f"<dataset>) or its {CHECKPOINT_FILE}")
    folder, checkpoint = (path.parent, path) if path.is_file() else (path, path / CHECKPOINT_FILE)
    metrics_file = folder / METRICS_FILE
    if not metrics_file.is_file() and not checkpoint.is_file():
        raise FileNotFoundError(f"report: '{folder}' has neither {METRICS_FILE} nor {CHECKPOINT_FILE}, so it is not a "
                                "run folder; every run writes both into runs/<time>-<strategy>-<dataset>/")
    parts = _checkpoint_parts(checkpoint) if checkpoint.is_file() else {}
    metrics = (read_csv_rows(metrics_file, ("round", "value")) if metrics_file.is_file()
               else parts.get("metrics", []))
    settings = parts.get("settings") or (settings_from_summary(folder / SUMMARY_FILE)
                                          if (folder / SUMMARY_FILE).is_file() else {})
    sites = parts.get("sites") or tuple(dict.fromkeys(r["site"] for r in metrics if r["site"] != POOLED))
    return RunData(
        folder=folder,
        settings=settings,
        sites=tuple(sites),
        metrics=metrics,
        traffic=_optional_rows(folder / TRAFFIC_FILE, ("round", "bytes", "array-bytes")),
        timing=_optional_rows(folder / TIMING_FILE, ("round", "seconds", "ended")),
        sweeps=parts.get("sweeps", {}),
        sweep_counts=parts.get("sweep_counts", {}),
        finished=any(row["split"] == "test" for row in metrics),
    )


def _optional_rows(path: Path, numeric: Sequence[str]) -> list[dict[str, Any]]:
    return read_csv_rows(path, numeric) if path.is_file() else []


def describe_settings(settings: Mapping[str, Any]) -> str:
    """``strategy on dataset, N rounds`` for the report's title."""
    strategy = settings.get("strategy", "run")
    dataset = settings.get("dataset", "?")
    rounds = settings.get("num-server-rounds", "?")
    return f"{strategy} on {dataset}, {rounds} rounds"
