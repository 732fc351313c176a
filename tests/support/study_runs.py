"""Run folders as the ServerApp leaves them, for the study tools that read them (compare, tune, the study).

:class:`FakeFlower` stands in for ``flwr run`` in the study's tests: it writes
what a run folder holds (``metrics.csv`` with the hand-made validation curve
:func:`curve`, ``checkpoint.pt``, ``test-images.csv``), checks every resume
with the ServerApp's own :func:`fedsm_core.run_files.checkpoint.check_resumable`
and stops as the ServerApp does, by the run config's ``stop-*`` keys.
"""

from __future__ import annotations

import csv
from pathlib import Path

from fedsm_core.analysis.image_dice import IMAGE_DICE_FILE
from fedsm_core.analysis.image_dice import write_rows as write_image_rows
from fedsm_core.config import RunConfig
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, check_resumable, load_checkpoint, save_checkpoint
from fedsm_core.run_files.run_outputs import CSV_COLUMNS
from fedsm_core.training.stopping_rule import stops_after, validation_curve


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


SITES = ("site-1", "site-2")
PLAN = """
[study]
datasets = ["synthetic-fundus"]
methods = ["fedavg", "centralized", "fedsm", "fedsm-extra"]
seeds = [0]
[stopping]
min-rounds = 6
max-rounds = 15
window = 2
min-gain = 0.002
check-every = 2
[run-config]
eval-every = 1
[methods]
centralized = { rounds-from = "fedavg" }
fedsm-extra = { rounds-from = "fedsm" }
"""


def curve(server_round: int) -> float:
    # +0.04 per round until round 9, flat after: the rule (gain over 2 rounds < 0.002) first holds at 11,
    # checked at 6, 8, 10 (gain 0.04) and 12 (gain 0): the run stops at 12.
    return 0.5 + 0.04 * min(server_round, 9)


class FakeFlower:
    """Writes one run folder per call; ``interrupt`` = (method, target, round) stops that chunk early.

    ``revalidation_gain``: as final fine-tuning does (``fine-tune-passes``), the
    last round is validated again, its super-model score this much higher.
    """

    def __init__(self, interrupt: tuple[str, int, int] | None = None, revalidation_gain: float = 0.0) -> None:
        self.calls: list[dict[str, object]] = []
        self.interrupt = interrupt
        self.revalidation_gain = revalidation_gain

    def __call__(self, settings: dict[str, object], runs: Path, label: str) -> Path:
        self.calls.append(dict(settings))
        config = RunConfig.from_mapping(settings)
        folder = runs / f"chunk-{len(list(runs.glob('chunk-*'))) if runs.is_dir() else 0:03d}"
        folder.mkdir(parents=True)
        metrics, first = [], 1
        if config.resume_from:
            checkpoint = load_checkpoint(config.resume_from)
            check_resumable(checkpoint, config.to_mapping(), SITES, config.total_rounds, config.resume_from)
            metrics, first = [tuple(r) for r in checkpoint["metrics"]], checkpoint["round"] + 1
        end = config.total_rounds
        if self.interrupt and self.interrupt[:2] == (config.strategy, config.num_server_rounds):
            end = self.interrupt[2]
        rule, last = config.stopping_rule, first - 1
        while last < end:  # the ServerApp's loop: train, validate, checkpoint, then ask the rule
            last += 1
            if last % config.eval_every == 0 or last == config.total_rounds:
                metrics += [(last, "val", "pooled", m, curve(last)) for m in ("dice-global", "dice-super")]
            if rule is not None and stops_after(validation_curve(metrics, "dice-super"), last, rule):
                break
        if config.fine_tune_passes and not (last < config.total_rounds and last == end):  # ended, not interrupted
            metrics = [(r, s, site, m, v + self.revalidation_gain if (r, s, m) == (last, "val", "dice-super") else v)
                       for r, s, site, m, v in metrics]
        save_checkpoint(folder / CHECKPOINT_FILE, last, config.to_mapping(), SITES, config.strategy, {}, metrics)
        if last < config.total_rounds and last == end:
            self._write(folder, metrics)
            raise RuntimeError("interrupted")
        metrics += [(last, "test", site, m, value) for site in (*SITES, "pooled")
                    for m, value in (("dice-global", 0.7), ("dice-super", 0.7), ("dice-personal", 0.65))]
        self._write(folder, metrics)
        write_image_rows(folder / IMAGE_DICE_FILE, [("site-1", "site-1/0001", True, 0.6),
                                                    ("site-2", "site-2/0001", True, 0.8)])
        return folder

    @staticmethod
    def _write(folder: Path, metrics: list[tuple]) -> None:
        with (folder / "metrics.csv").open("w", newline="") as handle:
            csv.writer(handle).writerows([CSV_COLUMNS, *metrics])


def fake_pooled(calls: list[dict[str, object]]):
    def run_pooled(methods, seed, overrides, on_model=None):
        calls.append(dict(overrides))
        rows = [{"site": site, "value": 0.75} for site in (*SITES, "pooled")]
        return rows, [(e, curve(e)) for e in range(1, overrides["num-server-rounds"] + 1)]
    return run_pooled


def prepare_study(tmp_path, monkeypatch, text: str):
    """A plan of ``text`` and its output folder, with the study's pooled training replaced by :func:`fake_pooled`.

    Returns ``(the study's arguments, the output folder, the pooled calls)``.
    """
    import experiments.study.run_plan as study

    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(text)
    pooled: list[dict[str, object]] = []
    monkeypatch.setattr(study, "run_pooled", fake_pooled(pooled))
    return ["--plan", str(plan), "--out", str(out)], out, pooled
