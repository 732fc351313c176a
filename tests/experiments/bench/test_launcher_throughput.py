"""The launcher benchmark's plan: every run trains exactly the asked rounds, with the asked settings."""

from __future__ import annotations

from experiments.bench.launcher_throughput import plan_text
from experiments.runner import parse_overrides
from experiments.study.plan import load_plan


def test_the_benchmark_plan_fixes_every_runs_rounds_and_carries_the_run_config(tmp_path):
    # Prepare
    overrides = parse_overrides("image-size=64 lr=0.002 dataset=synthetic-fundus-style softpull-lambda=0.9")
    dataset = str(overrides.pop("dataset"))
    path = tmp_path / "plan.toml"

    # Execute
    path.write_text(plan_text(dataset, ["fedavg", "fedprox"], [0, 1], 7, overrides))
    plan = load_plan(path)

    # Assert
    assert plan.stopping.min_rounds == plan.stopping.max_rounds == 7
    assert [job[:2] for job in plan.jobs()] == [("synthetic-fundus-style", 0), ("synthetic-fundus-style", 0),
                                                ("synthetic-fundus-style", 1), ("synthetic-fundus-style", 1)]
    settings = plan.settings("synthetic-fundus-style", "fedprox")
    assert settings["image-size"] == 64 and settings["lr"] == 0.002 and settings["softpull-lambda"] == 0.9
