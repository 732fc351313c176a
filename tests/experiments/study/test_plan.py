"""The study plan: the reference plan, and plans with mistakes."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.study.plan import StoppingRule, load_plan

RULE = StoppingRule(min_rounds=60, max_rounds=150, window=20, min_gain=0.002, check_every=10)
ROOT = Path(__file__).resolve().parents[3]


def _plan(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return path


GOOD = """
[study]
datasets = ["synthetic-fundus"]
methods = ["fedavg", "centralized"]
seeds = [0]
[methods]
centralized = { rounds-from = "fedavg" }
"""


REUSE = GOOD.replace('"fedavg", "centralized"', '"fedsm", "fedsm-softpull"').replace(
    'centralized = { rounds-from = "fedavg" }', 'fedsm-softpull = { rounds-from = "fedsm", reuse-rounds = true }')


def test_a_method_may_reuse_rounds_that_train_as_its_sources(tmp_path):
    # fedsm-softpull differs from fedsm in fine-tune-passes alone, which acts after the last round
    plan = load_plan(_plan(tmp_path, REUSE))
    assert plan.reuse_rounds == {"fedsm-softpull"} and plan.rounds_from == {"fedsm-softpull": "fedsm"}


def test_measured_with_sets_every_run_and_stays_out_of_what_the_key_hashes(tmp_path):
    plan = load_plan(_plan(tmp_path, GOOD + '[measured-with]\naggregation = "median"\n'))
    for method in plan.methods:
        settings = plan.settings("synthetic-fundus", method)
        assert settings["aggregation"] == "median"
        assert "aggregation" not in plan.keyed(settings)
    assert plan.keyed({"aggregation": "mean", "lr": 0.1}) == {"aggregation": "mean", "lr": 0.1}  # another value counts


def test_the_reference_plan_is_valid_and_orders_every_dependency():
    plan = load_plan(ROOT / "experiments" / "plans" / "reference.toml")
    assert len(plan.jobs()) == 4 * 3 * 7  # datasets (fundus, style-only, Drishti, prostate) x seeds x methods
    assert plan.stopping == RULE
    assert plan.rounds_from == {"centralized": "fedavg", "fedsm-extra": "fedsm"}


@pytest.mark.parametrize("path", sorted((ROOT / "experiments" / "plans").glob("*.toml")), ids=lambda p: p.stem)
def test_every_committed_plan_loads(path):
    assert load_plan(path).jobs()  # every setting checked, every rounds-from ordered


@pytest.mark.parametrize(("text", "match"), [
    (GOOD.replace('"fedavg", "centralized"', '"fedavg", "fedsmm"'), r"methods \['fedsmm'\] are unknown"),
    (GOOD.replace('"fedavg", "centralized"', '"centralized", "fedavg"'), "rounds-from = a method listed before"),
    (GOOD + "[stopping]\nmin-rounds = 80\nmax-rounds = 60\n", "min-rounds <= max-rounds"),
    (GOOD + "[stopping]\npatience = 3\n", r"\['patience'\] are not settings"),
    (GOOD + "[run-config]\nnum-server-rounds = 5\n", r"\['num-server-rounds'\] are set by the study"),
    (GOOD + "[run-config]\nstop-window = 5\n", r"\['stop-window'\] are set by the study"),
    (GOOD + "[run-config]\nlr = -1.0\n", "dataset synthetic-fundus, method fedavg"),
    (GOOD + '[run-config]\naggregation = "mean"\n[measured-with]\naggregation = "mean"\n',
     r"\[measured-with\] \['aggregation'\] are set by the study or by \[run-config\]"),
    (GOOD + "[measured-with]\nseed = 3\n", r"\[measured-with\] \['seed'\] are set by the study"),
    (GOOD + '[measured-with]\naggregation = "average"\n', "dataset synthetic-fundus, method fedavg.*aggregation"),
    (GOOD.replace("seeds = [0]", "seeds = []"), r"seeds = \[\] must be a non-empty list"),
    (GOOD + '[chosen]\n"synthetic-prostate" = "x.json"\n', r"\['synthetic-prostate'\] are not datasets"),
    (GOOD.replace('"fedavg" }', '"fedavg", reuse = true }'), "may set .*rounds-from.*reuse-rounds.* only"),
    (GOOD.replace('"fedavg" }', '"fedavg", reuse-rounds = "yes" }'), "reuse-rounds as true or false"),
    (GOOD.replace('"fedavg" }', '"fedavg", reuse-rounds = true }'), "centralized training keeps no checkpoint"),
    (REUSE.replace('"fedsm-softpull"]', '"fedsm-extra"]').replace("fedsm-softpull =", "fedsm-extra ="),
     r"settings differ in strategy: 'fedsm' -> 'fedsm-extra'"),
    (REUSE + '[run-config]\nlr-schedule = "cosine"\n', "needs a constant learning rate, found lr-schedule"),
])
def test_a_plan_with_a_mistake_names_the_file_and_the_setting(tmp_path, text, match):
    path = _plan(tmp_path, text)
    with pytest.raises(ValueError, match=match) as error:
        load_plan(path)
    assert str(path) in str(error.value)
