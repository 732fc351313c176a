"""One run of a study: its key and folder, how it is extended and resumed, and its rows of the long CSV.

A run is keyed by dataset, method, seed and a hash of everything else that
decides its result (its settings, the stopping rule, and for a method that
takes its round count from another, that run's key). Its files live in
``<runs>/<dataset>/<method>/seed<seed>-<hash>/``:

* the run folders of its ``flwr run`` chunks (written by the ServerApp, each
  with ``metrics.csv`` and ``checkpoint.pt``). A run under the stopping rule
  is one ``flwr run`` that stops itself (the ``stop-*`` keys); a chunk that was
  interrupted is continued by the next with ``resume-from``.
* ``chunks.jsonl``: wall seconds of every chunk this study started, and of scoring the test images;
* ``study-rows.csv``, written last: the run's rows of the long CSV. Its
  presence means "finished": a later sitting reads it and runs nothing.

Every row carries its run's hash (column ``run``), so the study's own
``results.csv``, committed to git, also says which runs finished: a clone on
another machine, without the run folders, skips them as well.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from fedsm_core.config import RunConfig
from fedsm_core.data.registry import dataset_label
from fedsm_core.methods import METHODS
from fedsm_core.run_files.checkpoint import (
    CHECKPOINT_FILE,
    CHECKPOINT_FORMAT,
    RESUMABLE_CHANGES,
    holds_after_training,
    load_checkpoint,
    with_keys_added_since,
)
from fedsm_core.training.stopping_rule import StoppingRule, stopping_round, validation_curve

ROWS_FILE = "study-rows.csv"
CHUNKS_FILE = "chunks.jsonl"
ROW_COLUMNS = ("dataset", "method", "seed", "run", "kind", "round", "site", "image", "value")
# kind: "test" (reported Dice per site and pooled), "image" (Dice of a test image with foreground), CASE_KINDS,
# "val" (pooled validation Dice per evaluated round), "seconds" (wall time of the whole run), and for
# FedSM's family the super model's parts tested alone (PART_KINDS: kind -> the ServerApp's test metric)
PART_KINDS = {"test-global": "dice-global", "test-personal": "dice-personal"}
# Where the test images are slices of cases (volumes, generated prostate cases), the reported model's per-case
# scores as well, per site and pooled: kind -> the prefix that replaces "dice-" in the method's score
# (dice-super -> case-dice-super). Absent for datasets of 2-D images.
CASE_KINDS = {"case-dice": "case-dice-", "case-hd95": "case-hd95-", "case-hd95-mm": "case-hd95-mm-"}
Launch = Callable[[dict[str, object], Path, str], Path]


@dataclasses.dataclass(frozen=True)
class RunKey:
    """Identity of one run of a study."""

    dataset: str
    method: str
    seed: int
    digest: str

    @property
    def dataset_label(self) -> str:
        """The dataset's short name: a federation spec's file stem, else the name."""
        return dataset_label(self.dataset)

    def folder(self, runs: Path) -> Path:
        """``<runs>/<dataset>/<method>/seed<seed>-<hash>``."""
        return runs / self.dataset_label / self.method / f"seed{self.seed}-{self.digest}"

    def __str__(self) -> str:
        return f"{self.dataset_label} {self.method} seed {self.seed}"


def run_key(dataset: str, method: str, seed: int, settings: Mapping[str, object], rule: StoppingRule,
            rounds_from: RunKey | None = None) -> RunKey:
    """The key of a run; its hash changes with any setting, the rule, or the run it takes rounds from."""
    content = {"settings": dict(settings), "rule": dataclasses.asdict(rule),
               "rounds-from": None if rounds_from is None else dataclasses.asdict(rounds_from)}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return RunKey(dataset, method, seed, digest)


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One run folder of a run: how far its checkpoint got and whether it finished (has test rows)."""

    folder: Path
    checkpoint_round: int
    num_server_rounds: int
    finished: bool


def read_chunks(key_folder: Path) -> list[Chunk]:
    """Every run folder under ``key_folder`` that has a checkpoint, oldest first."""
    chunks = []
    for folder in sorted(p for p in key_folder.iterdir() if (p / CHECKPOINT_FILE).is_file()):
        checkpoint = checkpoint_head(folder / CHECKPOINT_FILE)
        finished = any(r["split"] == "test" for r in read_metrics(folder))
        chunks.append(Chunk(folder, int(checkpoint["round"]), int(checkpoint["run-config"]["num-server-rounds"]),
                            finished))
    return chunks


def checkpoint_head(path: Path) -> dict[str, object]:
    """A checkpoint's round and run config, memory-mapped: a FedSM checkpoint holds 2K + 1 models."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # torch raises several types for damaged files; load_checkpoint words the error
        return load_checkpoint(path)
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        return load_checkpoint(path)
    return {"round": payload["round"], "run-config": payload["run-config"]}


def read_metrics(folder: Path) -> list[dict[str, str]]:
    """Rows of a run folder's ``metrics.csv`` (none when it is missing)."""
    path = folder / "metrics.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def resume_point(chunks: Sequence[Chunk], target: int, extra_rounds: int | None) -> Path | None:
    """The checkpoint to continue toward ``target`` rounds from: the furthest one a resume accepts.

    A resume may raise ``num-server-rounds`` but never pass the checkpoint's
    round. FedSM-extra (``extra_rounds`` given) switches to selector training
    at ``num-server-rounds``, so only a chunk of exactly ``target`` rounds
    continues it.
    """
    total = target + (extra_rounds or 0)
    usable = [c for c in chunks if c.checkpoint_round < total and
              (c.num_server_rounds == target if extra_rounds is not None else c.num_server_rounds <= target)]
    best = max(usable, key=lambda c: c.checkpoint_round, default=None)
    return None if best is None else best.folder / CHECKPOINT_FILE


def interrupted_checkpoint(runs: Path, settings: Mapping[str, object]) -> Path | None:
    """The checkpoint an interrupted ``flwr run`` of exactly ``settings`` left under ``runs``, if any.

    Only a run folder without test results counts, and only when its run config
    equals ``settings`` in every key a resume may not change (outside
    :data:`~fedsm_core.run_files.checkpoint.RESUMABLE_CHANGES`): a rerun with other
    settings starts afresh rather than being refused by the ServerApp. Of
    those, :func:`resume_point` takes the furthest toward ``num-server-rounds``.
    """
    if not runs.is_dir():
        return None
    config = RunConfig.from_mapping(settings)
    wanted = _training_keys(config.to_mapping())
    chunks = [c for c in read_chunks(runs) if not c.finished and _same_training(c, wanted)]
    extra = config.extra_rounds if METHODS[config.strategy].extra_selector else None
    return resume_point(chunks, config.num_server_rounds, extra)


def finished_checkpoint(runs: Path, settings: Mapping[str, object]) -> Path | None:
    """The checkpoint of the newest finished ``flwr run`` of exactly ``settings`` under ``runs``, if any.

    As in :func:`interrupted_checkpoint`, keys a resume may change are not compared.
    """
    if not runs.is_dir():
        return None
    wanted = _training_keys(RunConfig.from_mapping(settings).to_mapping())
    chunks = [c for c in read_chunks(runs) if c.finished and _same_training(c, wanted)]
    return chunks[-1].folder / CHECKPOINT_FILE if chunks else None


def _training_keys(run_config: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in run_config.items() if k not in RESUMABLE_CHANGES}


def _same_training(chunk: Chunk, wanted: Mapping[str, object]) -> bool:
    """Whether a chunk's checkpoint trained with ``wanted`` (keys it predates as the ServerApp's resume reads them)."""
    saved = checkpoint_head(chunk.folder / CHECKPOINT_FILE)["run-config"]
    return _training_keys(with_keys_added_since(saved, wanted)) == wanted


def metric_rows(rows: Sequence[Mapping[str, str]]) -> list[tuple[str, ...]]:
    """``metrics.csv`` rows as the ``(round, split, site, metric, value)`` tuples the ServerApp logs."""
    return [(r["round"], r["split"], r["site"], r["metric"], r["value"]) for r in rows]


def completes(chunk: Chunk, fixed_rounds: int | None, rule: StoppingRule, score: str) -> bool:
    """Whether a finished chunk is the run's result: its fixed length, or the rule held (or max-rounds was reached).

    A run that tested before its ``num-server-rounds`` stopped itself by the
    rule (the ``stop-*`` keys); its curve may no longer show it, since final
    fine-tuning validates the round it stopped at again, with the fine-tuned
    models. Chunks that an earlier version of the study ended at ``min-rounds +
    k * check-every`` (their own ``num-server-rounds``) without the rule
    holding are not results: the run resumes from them.
    """
    if not chunk.finished:
        return False
    if fixed_rounds is not None:
        return chunk.num_server_rounds == fixed_rounds
    if chunk.checkpoint_round < chunk.num_server_rounds:
        return True
    curve = validation_curve(metric_rows(read_metrics(chunk.folder)), score)
    return chunk.checkpoint_round >= rule.max_rounds or stopping_round(curve, rule) is not None


def stop_keys(rule: StoppingRule) -> dict[str, object]:
    """The run-config keys that make a ``flwr run`` of ``max-rounds`` rounds stop itself by ``rule``."""
    return {"stop-window": rule.window, "stop-min-gain": rule.min_gain, "stop-min-rounds": rule.min_rounds,
            "stop-check-every": rule.check_every}


def run_federated(key: RunKey, runs: Path, settings: Mapping[str, object], rule: StoppingRule,
                  fixed_rounds: int | None, launch: Launch, start_from: Path | None = None) -> Path:
    """Train ``key`` until the rule holds (or for ``fixed_rounds``); returns the final run folder.

    One ``flwr run`` of up to ``max-rounds`` rounds, which stops itself by the
    rule (the ``stop-*`` keys), or one of exactly ``fixed_rounds``. It resumes
    from the newest checkpoint on disk, so an interrupted study picks up here;
    without one, from ``start_from`` (another run's checkpoint of round
    ``fixed_rounds``, :func:`finishable_checkpoint`): the run then trains no
    round and only finishes that checkpoint with its own settings.
    """
    folder = key.folder(runs)
    config = RunConfig.from_mapping({**settings, "num-server-rounds": 1})
    extra = config.extra_rounds if METHODS[config.strategy].extra_selector else None
    score = METHODS[key.method].score
    target = rule.max_rounds if fixed_rounds is None else fixed_rounds
    chunks = read_chunks(folder) if folder.is_dir() else []
    done = result_chunk(chunks, fixed_rounds, rule, score)
    if done is not None:
        return done.folder
    start = resume_point(chunks, target, extra) or start_from
    overrides = {**settings, "num-server-rounds": target, **(stop_keys(rule) if fixed_rounds is None else {}),
                 **({"resume-from": str(start)} if start else {})}
    began = time.monotonic()
    launch(overrides, folder, f"study {key} to round {target}" + (" or the rule" if fixed_rounds is None else ""))
    record_seconds(folder, f"rounds 1-{target}" if start is None else f"rounds to {target} from {start}",
                   time.monotonic() - began)
    done = result_chunk(read_chunks(folder), fixed_rounds, rule, score)
    if done is None:
        raise RuntimeError(f"{key}: the run to round {target} ended without test results in {folder}")
    return done.folder


def finishable_checkpoint(source: RunKey, runs: Path, rounds: int) -> Path | None:
    """The checkpoint of ``source``'s last round, ``rounds``, if a run with other after-training keys may finish it.

    ``None`` (saying why: no run folder of the source here ends there, or its models were fine-tuned
    before its checkpoint was saved, as in a run of fixed length): the run then trains its rounds.
    """
    folder = source.folder(runs)
    ends = [c for c in read_chunks(folder) if c.finished and c.checkpoint_round == rounds] if folder.is_dir() else []
    path = ends[-1].folder / CHECKPOINT_FILE if ends else None
    why = f"no finished run folder of it ends at round {rounds} here" if path is None else ""
    if path and holds_after_training(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["state"]):
        why = "its checkpoint holds models fine-tuned after that round"
    if why:
        print(f"[study] reuse-rounds: cannot finish {source}'s checkpoint ({why}); training the rounds", flush=True)
        return None
    return path


def result_chunk(chunks: Sequence[Chunk], fixed_rounds: int | None, rule: StoppingRule, score: str) -> Chunk | None:
    """The chunk that holds the run's result (see :func:`completes`), the furthest if several do."""
    return max((c for c in chunks if completes(c, fixed_rounds, rule, score)), key=lambda c: c.checkpoint_round,
               default=None)


def record_seconds(folder: Path, part: str, seconds: float) -> None:
    """Append one part of a run's wall time (a chunk of rounds, the per-image scoring) to ``chunks.jsonl``."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / CHUNKS_FILE).open("a") as handle:
        handle.write(json.dumps({"part": part, "seconds": round(seconds, 1)}) + "\n")


def chunk_seconds(folder: Path) -> float:
    """Wall seconds the study spent on this key, all sittings (an interrupted chunk's time is lost)."""
    path = folder / CHUNKS_FILE
    if not path.is_file():
        return 0.0
    return sum(json.loads(line)["seconds"] for line in path.read_text().splitlines() if line.strip())


def federated_rows(key: RunKey, final: Path, images: Sequence[tuple[str, str, bool, float]],
                   seconds: float) -> list[dict[str, object]]:
    """The long-CSV rows of a finished federated run (test per site, images, validation curve, seconds)."""
    metrics = read_metrics(final)
    score = METHODS[key.method].score
    rounds = max((int(r["round"]) for r in metrics if r["split"] == "test"), default=0)
    tests = [(r["site"], float(r["value"])) for r in metrics if r["split"] == "test" and r["metric"] == score]
    cases = case_scores({(r["site"], r["metric"]): float(r["value"]) for r in metrics if r["split"] == "test"}, score)
    rows = result_rows(key, rounds, tests, images, validation_curve(metric_rows(metrics), score), seconds, cases)
    if METHODS[key.method].family == "fedsm":  # the global model alone, each site's own personalized model alone
        base = {"dataset": key.dataset_label, "method": key.method, "seed": key.seed, "run": key.digest}
        rows += [{**base, "kind": kind, "round": rounds, "site": r["site"], "image": "", "value": float(r["value"])}
                 for kind, metric in PART_KINDS.items() for r in metrics
                 if r["split"] == "test" and r["metric"] == metric]
    return rows


def case_scores(test: Mapping[tuple[str, str], float], score: str) -> list[tuple[str, str, float]]:
    """``(kind, site, value)`` of :data:`CASE_KINDS` from one run's test metrics (``(site, metric) -> value``).

    ``score`` is the method's reported metric (``dice-<model>``); its case
    scores are ``case-dice-<model>`` and so on. Empty where the run scored no
    cases (2-D images).
    """
    model = score.removeprefix("dice-")
    return [(kind, site, value) for kind, prefix in CASE_KINDS.items()
            for (site, metric), value in test.items() if metric == prefix + model]


def result_rows(key: RunKey, rounds: int, tests: Sequence[tuple[str, float]],
                images: Sequence[tuple[str, str, bool, float]], curve: Sequence[tuple[int, float]],
                seconds: float, cases: Sequence[tuple[str, str, float]] = ()) -> list[dict[str, object]]:
    """Rows of :data:`ROW_COLUMNS` for one run; images without foreground are left out (as in every Dice mean).

    ``cases`` are the run's :func:`case_scores`: one row of their kind per site.
    """
    base = {"dataset": key.dataset_label, "method": key.method, "seed": key.seed, "run": key.digest}
    rows = [{**base, "kind": "test", "round": rounds, "site": site, "image": "", "value": value}
            for site, value in tests]
    rows += [{**base, "kind": kind, "round": rounds, "site": site, "image": "", "value": value}
             for kind, site, value in cases]
    rows += [{**base, "kind": "image", "round": rounds, "site": site, "image": image, "value": dice}
             for site, image, foreground, dice in images if foreground]
    rows += [{**base, "kind": "val", "round": r, "site": "pooled", "image": "", "value": v} for r, v in curve]
    rows.append({**base, "kind": "seconds", "round": rounds, "site": "", "image": "", "value": round(seconds, 1)})
    return rows


def write_rows(path: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    """Rows of :data:`ROW_COLUMNS` as CSV (``path`` is replaced atomically, so a crash never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=ROW_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    partial.replace(path)
    return path


def read_rows(path: Path) -> list[dict[str, str]]:
    """Rows written by :func:`write_rows`."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if rows and set(ROW_COLUMNS) - set(rows[0]):
        raise ValueError(f"{path}: missing columns {sorted(set(ROW_COLUMNS) - set(rows[0]))}; expected "
                         f"{list(ROW_COLUMNS)} (written by experiments.study.run_plan)")
    return rows
