"""The study runner with a stand-in for ``flwr run``: runs that stop by the rule, resume, skipping finished runs.

The stand-in (:class:`support.study_runs.FakeFlower`) writes what a run folder
holds, checks every resume as the ServerApp does and stops by the ``stop-*`` keys.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.study_runs import PLAN, FakeFlower, fake_pooled, prepare_study

import experiments.study.run_plan as study
from experiments.study.plan import StoppingRule, load_plan
from experiments.study.runs import Chunk, RunKey, read_rows, resume_point, run_key
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, load_checkpoint


def _rounds(rows, method: str) -> set[int]:
    return {int(r["round"]) for r in rows if r["method"] == method and r["kind"] == "test"}


def test_a_study_extends_by_the_rule_resumes_after_an_interruption_and_skips_what_finished(tmp_path, monkeypatch):
    # Prepare
    args, out, pooled_calls = prepare_study(tmp_path, monkeypatch, PLAN)

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


REUSE = PLAN.replace('"fedsm", "fedsm-extra"]', '"fedsm", "fedsm-softpull"]').replace(
    'fedsm-extra = { rounds-from = "fedsm" }', 'fedsm-softpull = { rounds-from = "fedsm", reuse-rounds = true }')


def test_a_method_that_reuses_its_sources_rounds_finishes_the_sources_last_checkpoint(tmp_path, monkeypatch):
    # Prepare: FedSM stops by the rule at round 12; fedsm-softpull takes its rounds (fine-tune-passes = 0)
    args, out, _ = prepare_study(tmp_path, monkeypatch, REUSE)
    flower = FakeFlower()

    # Execute
    study.main(args, launch=flower)

    # Assert: one launch of fedsm-softpull, from FedSM's checkpoint of round 12, for 12 rounds: none trains
    fedsm, softpull = [c for c in flower.calls if c["strategy"] == "fedsm"]
    assert fedsm["num-server-rounds"] == 15 and "resume-from" not in fedsm
    assert softpull["num-server-rounds"] == 12 and softpull["fine-tune-passes"] == 0
    source = load_checkpoint(softpull["resume-from"])
    assert source["round"] == 12 and source["run-config"]["fine-tune-passes"] == 30
    assert Path(softpull["resume-from"]).parent.parent.parent.name == "fedsm"
    assert _rounds(read_rows(out / "results.csv"), "fedsm-softpull") == {12}
    # the run key is the one a plan without reuse-rounds gives: how the rounds are obtained is not what they are
    plain = study.plan_jobs(load_plan(_write(tmp_path, REUSE.replace(", reuse-rounds = true", ""))))
    assert [key for key, _, _ in study.plan_jobs(load_plan(_write(tmp_path, REUSE)))] == [key for key, _, _ in plain]


def test_a_run_that_stopped_itself_stays_finished_when_fine_tuning_raises_its_last_validation(tmp_path, monkeypatch):
    # Prepare: FedSM, validated every 2 rounds, stops by the rule at round 12; final fine-tuning validates round 12
    # again, 5 points higher, so the curve in its metrics no longer shows the rule holding anywhere
    args, out, _ = prepare_study(tmp_path, monkeypatch, PLAN.replace("eval-every = 1", "eval-every = 2"))
    flower = FakeFlower(revalidation_gain=0.05)

    # Execute
    study.main([*args, "--methods", "fedsm"], launch=flower)
    study.main([*args, "--methods", "fedsm"], launch=flower)  # a later sitting finds it finished too

    # Assert: one launch, its result the round it stopped at
    assert [c["strategy"] for c in flower.calls] == ["fedsm"]
    assert _rounds(read_rows(out / "results.csv"), "fedsm") == {12}


def test_without_the_sources_run_folder_the_rounds_train(tmp_path, monkeypatch, capsys):
    # Prepare: FedSM finished, then its run folders went (its rows stay in results.csv)
    args, out, _ = prepare_study(tmp_path, monkeypatch, REUSE)
    study.main([*args, "--methods", "fedsm"], launch=FakeFlower())
    shutil.rmtree(out / "runs" / "synthetic-fundus" / "fedsm")
    flower = FakeFlower()

    # Execute
    study.main(args, launch=flower)

    # Assert: fedsm-softpull (FedSM finished) trains its 12 rounds, and says why
    assert [(c["num-server-rounds"], "resume-from" in c) for c in flower.calls if c["strategy"] == "fedsm"] == [
        (12, False)]
    assert "cannot finish" in capsys.readouterr().out


def _write(folder: Path, text: str) -> Path:
    path = folder / "plan-copy.toml"
    path.write_text(text)
    return path
