"""What every finished run of a study trained with, so that a default changed since then marks the run stale.

A run's key (:func:`experiments.study.runs.run_key`) hashes the plan's
settings, not the defaults they leave to ``RunConfig`` (which equal
``pyproject.toml``'s ``[tool.flwr.app.config]``). When a default changes, say
``softpull-lambda``, a finished run keeps its key and would be tabulated beside
runs trained with the new value. So the study records, per finished run, the
whole run config it resolved to (``<out>/run-configs.jsonl``, committed beside
``results.csv``), and every sitting compares each record with what the plan
resolves to today. A run whose record differs is *stale*, and so is a run that
takes its round count from a stale one; the sitting stops before anything
trains and names each stale run with the keys that changed, unless told
``--rerun-stale`` (:func:`set_aside` moves its rows to ``stale-results.csv``
and its folder aside, then it trains again) or ``--keep-stale``. A study under
way keeps measuring with the old value when its plan names it under
``[measured-with]``: every run then trains with it, and it stays out of the
runs' keys, so the finished runs keep theirs.

A run that finished before configs were recorded gets its record from its
run folder's checkpoint (the run config the ServerApp itself resolved) where
the folder is still there; without it the run is *unchecked* and the sitting
says so. A key added after a record was made counts as unchanged unless
``BEFORE_THE_KEY`` (:mod:`fedsm_core.run_files.checkpoint`) names the value
that reproduces the behaviour from before it. Keys a resume may change (:data:`RESUMABLE_CHANGES`: round count,
device, threads, the stopping rule, which the key holds) are not compared.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from experiments.study.runs import ROWS_FILE, RunKey, checkpoint_head, read_chunks, read_rows, write_rows
from fedsm_core.config import RunConfig
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, RESUMABLE_CHANGES, with_keys_added_since

CONFIGS_FILE = "run-configs.jsonl"
STALE_ROWS_FILE = "stale-results.csv"
Label = tuple[str, str, int, str]  # dataset (short name), method, seed, run hash
Records = dict[Label, dict[str, object]]


@dataclasses.dataclass(frozen=True)
class ConfigCheck:
    """The outcome of comparing a study's records with today's resolution: stale runs (with why) and unchecked."""

    stale: dict[RunKey, list[str]]
    unchecked: list[RunKey]

    def report(self) -> str:
        """One line per stale run: the keys that changed, recorded -> today."""
        return "\n".join(f"  {key}: {'; '.join(reasons)}" for key, reasons in self.stale.items())


def resolve(settings: Mapping[str, object]) -> dict[str, object]:
    """The run config ``settings`` resolve to today (defaults filled in), without the keys a resume may change."""
    return comparable(RunConfig.from_mapping({**settings, "num-server-rounds": 1}).to_mapping())


def comparable(run_config: Mapping[str, object]) -> dict[str, object]:
    """A run config as JSON values (what the record file holds), without :data:`RESUMABLE_CHANGES`."""
    kept = {key: value for key, value in run_config.items() if key not in RESUMABLE_CHANGES}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def differences(recorded: Mapping[str, object], today: Mapping[str, object]) -> list[str]:
    """``"key: recorded -> today"`` for every key whose value differs.

    A key added since the record was made takes the value from before it
    (:func:`~fedsm_core.run_files.checkpoint.with_keys_added_since`); a key
    removed since shows as None.
    """
    recorded = with_keys_added_since(recorded, today)
    keys = sorted(set(recorded) | set(today))
    return [f"{key}: {recorded.get(key)!r} -> {today.get(key)!r}" for key in keys
            if recorded.get(key) != today.get(key)]


def read_configs(out: Path) -> Records:
    """``<out>/run-configs.jsonl`` as {:func:`label` of the run: record}; empty before the first run finished."""
    path = out / CONFIGS_FILE
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(str(r["dataset"]), str(r["method"]), int(r["seed"]), str(r["run"])): r for r in records}


def write_configs(out: Path, records: Records) -> Path:
    """Write the records, one JSON object per line, sorted by run, atomically."""
    path = out / CONFIGS_FILE
    partial = path.with_name(path.name + ".partial")
    lines = [json.dumps(records[key], sort_keys=True) for key in sorted(records)]
    partial.write_text("".join(line + "\n" for line in lines))
    partial.replace(path)
    return path


def label(key: RunKey) -> Label:
    """A run key by its dataset's short name, so a record matches however the plan spells the dataset."""
    return (key.dataset_label, key.method, key.seed, key.digest)


def make_record(key: RunKey, config: Mapping[str, object], source: str) -> dict[str, object]:
    """One line of the record file; ``source`` says where the config came from ("resolved at the end", ...)."""
    return {"dataset": key.dataset_label, "method": key.method, "seed": key.seed, "run": key.digest,
            "source": source, "config": dict(config)}


def checkpoint_record(key: RunKey, runs: Path) -> dict[str, object] | None:
    """The record of a finished federated run from its newest finished chunk's checkpoint, if its folder is here."""
    folder = key.folder(runs)
    chunks = [chunk for chunk in read_chunks(folder) if chunk.finished] if folder.is_dir() else []
    if not chunks:
        return None
    saved = checkpoint_head(chunks[-1].folder / CHECKPOINT_FILE)["run-config"]
    return make_record(key, comparable(saved), f"checkpoint of {chunks[-1].folder.name}")


def check_configs(jobs: Sequence[tuple[RunKey, Mapping[str, object], RunKey | None]], finished: set[RunKey],
                  records: Records, runs: Path) -> ConfigCheck:
    """Compare every finished run's record with today's resolution; fills ``records`` from checkpoints it finds.

    ``records`` is keyed as :func:`read_configs` keys it. A run is stale when
    its record differs, or when the run it takes its rounds from is stale.
    """
    stale: dict[RunKey, list[str]] = {}
    unchecked: list[RunKey] = []
    for key, settings, source in jobs:
        if key not in finished:
            continue
        record = records.get(label(key)) or checkpoint_record(key, runs)
        if record is None:
            unchecked.append(key)
        else:
            records[label(key)] = record
            changed = differences(record["config"], resolve(settings))
            if changed:
                stale[key] = changed
        if source is not None and source in stale:
            stale.setdefault(key, []).append(f"takes its rounds from {source.method}, which is stale")
    return ConfigCheck(stale, unchecked)


def set_aside(key: RunKey, runs: Path, out: Path, records: Records) -> None:
    """Make a stale run unfinished: its rows move to ``stale-results.csv``, its folder to ``<folder>.stale-<time>``.

    The rows stay as evidence of what the old defaults gave; the record goes,
    so the rerun records the config it trains with.
    """
    results = out / "results.csv"
    rows = read_rows(results) if results.is_file() else []
    mine = [row for row in rows if (row["dataset"], row["method"], int(row["seed"]), row["run"]) == label(key)]
    if not mine and (key.folder(runs) / ROWS_FILE).is_file():
        mine = read_rows(key.folder(runs) / ROWS_FILE)
    aside = out / STALE_ROWS_FILE
    write_rows(aside, [*(read_rows(aside) if aside.is_file() else []), *mine])
    write_rows(results, [row for row in rows if row not in mine])
    folder = key.folder(runs)
    if folder.is_dir():
        folder.rename(folder.with_name(f"{folder.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}"))
    records.pop(label(key), None)
