"""The study runner with a stand-in for ``flwr run``: runs that stop by the rule, resume, skipping finished runs.

The stand-in writes what a run folder holds (``metrics.csv`` with a hand-made
validation curve, ``checkpoint.pt``, ``test-images.csv``), checks every resume
with the ServerApp's own :func:`fedsm_core.run_files.checkpoint.check_resumable` and
stops as the ServerApp does, by the run config's ``stop-*`` keys.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import experiments.study.run_plan as study
from experiments.study.plan import StoppingRule
from experiments.study.runs import Chunk, RunKey, read_rows, resume_point, run_key
from fedsm_core.analysis.image_dice import IMAGE_DICE_FILE
from fedsm_core.analysis.image_dice import write_rows as write_image_rows
from fedsm_core.config import RunConfig
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, check_resumable, load_checkpoint, save_checkpoint
from fedsm_core.run_files.run_outputs import CSV_COLUMNS
from fedsm_core.training.stopping_rule import stops_after, validation_curve

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
    """Writes one run folder per call; ``interrupt`` = (method, target, round) stops that chunk early."""

    def __init__(self, interrupt: tuple[str, int, int] | None = None) -> None:
        self.calls: list[dict[str, object]] = []
        self.interrupt = interrupt

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
            metrics += [(last, "val", "pooled", m, curve(last)) for m in ("dice-global", "dice-super")]
            if rule is not None and stops_after(validation_curve(metrics, "dice-super"), last, rule):
                break
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


def _rounds(rows, method: str) -> set[int]:
    return {int(r["round"]) for r in rows if r["method"] == method and r["kind"] == "test"}


def test_a_study_extends_by_the_rule_resumes_after_an_interruption_and_skips_what_finished(tmp_path, monkeypatch):
    # Prepare
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(PLAN)
    pooled_calls: list[dict[str, object]] = []
    monkeypatch.setattr(study, "run_pooled", fake_pooled(pooled_calls))
    args = ["--plan", str(plan), "--out", str(out)]

    # Execute: FedSM's run (up to 15 rounds) is interrupted at round 7; then the same command twice more
    first = FakeFlower(interrupt=("fedsm", 15, 7))
    with pytest.raises(RuntimeError, match="interrupted"):
        study.main(args, launch=first)
    after_interruption = read_rows(out / "results.csv")
    second = FakeFlower()
    study.main(args, launch=second)
    finished = (out / "results.csv").read_bytes()
    third = FakeFlower()
    study.main(args, launch=third)

    # Assert: FedAvg ran once, up to max-rounds with the rule, and stopped itself at round 12
    fedavg = [c for c in first.calls if c["strategy"] == "fedavg"]
    assert [c["num-server-rounds"] for c in fedavg] == [15] and "resume-from" not in fedavg[0]
    assert {k: fedavg[0][k] for k in fedavg[0] if k.startswith("stop-")} == {
        "stop-window": 2, "stop-min-gain": 0.002, "stop-min-rounds": 6, "stop-check-every": 2}
    assert pooled_calls[0]["num-server-rounds"] == 12  # centralized: as many passes as FedAvg's rounds
    assert _rounds(after_interruption, "fedavg") == _rounds(after_interruption, "centralized") == {12}
    assert not _rounds(after_interruption, "fedsm")
    # The second sitting starts nothing finished and continues FedSM from its round-7 checkpoint.
    assert {c["strategy"] for c in second.calls} == {"fedsm", "fedsm-extra"}
    resumed = second.calls[0]
    assert resumed["num-server-rounds"] == 15 and resumed["stop-window"] == 2
    assert load_checkpoint(resumed["resume-from"])["round"] == 7
    extra = [c for c in second.calls if c["strategy"] == "fedsm-extra"]
    assert [c["num-server-rounds"] for c in extra] == [12]  # FedSM's rounds, fixed: no rule
    assert not any(k.startswith("stop-") for k in extra[0])
    rows = read_rows(out / "results.csv")
    assert _rounds(rows, "fedsm") == {12}
    assert _rounds(rows, "fedsm-extra") == {12 + 10}  # its models' rounds plus extra-rounds = 10 for the selector
    assert not third.calls and len(pooled_calls) == 1
    assert (out / "results.csv").read_bytes() == finished
    for name in ("table.md", "curves.png", "commands.md"):
        assert (out / name).is_file()
    assert "## synthetic-fundus" in (out / "table.md").read_text()


def test_the_key_changes_with_any_setting_and_the_rule_but_not_with_the_round_count():
    rule = StoppingRule(min_rounds=6, max_rounds=15, window=2, check_every=2)
    base = run_key("synthetic-fundus", "fedavg", 0, {"lr": 0.002}, rule)
    assert run_key("synthetic-fundus", "fedavg", 0, {"lr": 0.002}, rule) == base
    assert run_key("synthetic-fundus", "fedavg", 0, {"lr": 0.001}, rule).digest != base.digest
    assert run_key("synthetic-fundus", "fedavg", 0, {"lr": 0.002}, StoppingRule()).digest != base.digest
    assert run_key("synthetic-fundus", "centralized", 0, {"lr": 0.002}, rule, base).digest != \
        run_key("synthetic-fundus", "centralized", 0, {"lr": 0.002}, rule).digest
    assert base.folder(Path("runs")) == Path("runs/synthetic-fundus/fedavg") / f"seed0-{base.digest}"
    assert RunKey("experiments/federations/drishti-six-site.toml", "fedsm", 1, "x").dataset_label == "drishti-six-site"


def test_resume_point_takes_the_furthest_checkpoint_a_resume_accepts():
    chunks = [Chunk(Path("a"), 6, 6, True), Chunk(Path("b"), 7, 8, False), Chunk(Path("c"), 8, 8, True)]
    assert resume_point(chunks, 10, None) == Path("c") / CHECKPOINT_FILE
    assert resume_point(chunks, 8, None) == Path("b") / CHECKPOINT_FILE  # c already reached round 8
    assert resume_point(chunks[:1], 6, None) is None
    # FedSM-extra: only a chunk of the same num-server-rounds, before its last (extra) round
    extra = [Chunk(Path("x"), 9, 12, False), Chunk(Path("y"), 6, 6, True)]
    assert resume_point(extra, 12, 10) == Path("x") / CHECKPOINT_FILE
    assert resume_point(extra, 14, 10) is None


def test_a_clone_with_only_the_committed_csv_skips_the_runs_it_holds(tmp_path, monkeypatch):
    # Prepare: a finished study, then its run folders removed (a clone holds results.csv, not runs/)
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(PLAN.replace('"fedsm", "fedsm-extra"', '"fedsm"')
                    .replace('fedsm-extra = { rounds-from = "fedsm" }', ''))
    monkeypatch.setattr(study, "run_pooled", fake_pooled([]))
    args = ["--plan", str(plan), "--out", str(out)]
    study.main(args, launch=FakeFlower())
    committed = (out / "results.csv").read_bytes()
    import shutil
    shutil.rmtree(out / "runs")
    rows = read_rows(out / "results.csv")
    (out / "results.csv").write_text("".join(  # FedSM's rows lost: that run has to run again
        line for line in committed.decode().splitlines(keepends=True) if ",fedsm," not in line))

    # Execute
    again = FakeFlower()
    study.main(args, launch=again)

    # Assert: FedAvg and centralized are read from the CSV (by their hash); only FedSM trains again
    assert {c["strategy"] for c in again.calls} == {"fedsm"}
    assert {r["run"] for r in rows if r["method"] == "fedavg"} == {study.plan_jobs(study.load_plan(plan))[0][0].digest}
    assert (out / "results.csv").read_bytes() == committed


def test_datasets_runs_only_the_named_ones_and_refuses_names_not_in_the_plan(tmp_path, capsys):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(PLAN.replace('["synthetic-fundus"]', '["synthetic-fundus", "synthetic-fundus-style"]')
                    .replace('"fedavg", "centralized", "fedsm", "fedsm-extra"', '"fedavg"').split("[methods]")[0])
    launch = FakeFlower()
    study.main(["--plan", str(plan), "--out", str(out), "--datasets", "synthetic-fundus-style"], launch=launch)
    assert [c["dataset"] for c in launch.calls] == ["synthetic-fundus-style"]
    assert "run 1 of 1, 1 left" in capsys.readouterr().out  # progress counts the named datasets only
    assert "0 of 2 runs finished at the start; ran only synthetic-fundus-style" in (out / "commands.md").read_text()
    with pytest.raises(ValueError, match="--datasets: \\['drishti'\\] are not in the plan"):
        study.main(["--plan", str(plan), "--out", str(out), "--datasets", "drishti"], launch=launch)


def test_methods_and_seeds_run_part_of_a_plan_and_a_run_needs_the_run_it_takes_rounds_from(tmp_path, capsys):
    # Prepare: FedAvg and FedSM, seeds 0 and 1; FedSM-extra takes its rounds from FedSM
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(PLAN.replace('"fedavg", "centralized", "fedsm", "fedsm-extra"', '"fedavg", "fedsm", "fedsm-extra"')
                    .replace("seeds = [0]", "seeds = [0, 1]").replace('centralized = { rounds-from = "fedavg" }', ""))
    launch = FakeFlower()

    # Execute / Assert: FedSM-extra alone is refused before anything trains, FedSM has not finished
    with pytest.raises(ValueError, match="takes its rounds from fedsm, which has not finished.*--methods fedsm"):
        study.main(["--plan", str(plan), "--out", str(out), "--methods", "fedsm-extra"], launch=launch)
    assert launch.calls == []
    with pytest.raises(ValueError, match="--seeds: \\[7\\] are not in the plan"):
        study.main(["--plan", str(plan), "--out", str(out), "--seeds", "7"], launch=launch)

    # Execute / Assert: with its source selected it runs after it, and only seed 1 of the two methods runs
    study.main(["--plan", str(plan), "--out", str(out), "--methods", "fedsm", "fedsm-extra", "--seeds", "1"],
               launch=launch)
    assert [(c["strategy"], c["seed"]) for c in launch.calls] == [("fedsm", 1), ("fedsm-extra", 1)]
    assert "run 2 of 2, 1 left" in capsys.readouterr().out
    assert "ran only fedsm, fedsm-extra, seed 1" in (out / "commands.md").read_text()


def test_a_run_an_earlier_study_extended_chunk_by_chunk_continues_from_its_last_chunk(tmp_path, monkeypatch):
    # Prepare: FedAvg's folder holds a finished chunk of 8 rounds without the stop-* keys (how the study
    # used to extend runs); at round 8 the rule has not held (gain 0.08 over 2 rounds)
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(PLAN.replace('"fedavg", "centralized", "fedsm", "fedsm-extra"', '"fedavg"').split("[methods]")[0])
    key = study.plan_jobs(study.load_plan(plan))[0][0]
    folder = key.folder(out / "runs")
    settings = {**study.load_plan(plan).settings("synthetic-fundus", "fedavg"), "seed": 0, "data-seed": 0}
    FakeFlower()({**settings, "num-server-rounds": 8}, folder, "an old chunk")

    # Execute
    launch = FakeFlower()
    study.main(["--plan", str(plan), "--out", str(out)], launch=launch)

    # Assert: one more flwr run, from the old chunk's round-8 checkpoint, stopping by the rule at 12
    assert len(launch.calls) == 1 and load_checkpoint(launch.calls[0]["resume-from"])["round"] == 8
    assert _rounds(read_rows(out / "results.csv"), "fedavg") == {12}
