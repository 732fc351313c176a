"""RunConfig composes each subsystem's settings from the flat keys: defaults, values and checks live in the owner."""

from __future__ import annotations

import dataclasses

import pytest

from fedsm_core.algorithms.attacks import AttackSettings
from fedsm_core.algorithms.baselines.harmofl_settings import HarmoFLSettings
from fedsm_core.algorithms.fedsm.settings import FedSMSettings
from fedsm_core.algorithms.knn_per.settings import KNNPerSettings
from fedsm_core.algorithms.personalization.settings import PersonalizationSettings
from fedsm_core.algorithms.robust_aggregation import AggregationSettings
from fedsm_core.algorithms.server_optimizer import ServerOptimizerSettings
from fedsm_core.checks import allowed_values, check_settings, setting
from fedsm_core.config import RunConfig
from fedsm_core.training.lr_schedule import LRSchedule
from fedsm_core.training.settings import TrainingSettings
from fedsm_core.training.stopping_rule import StoppingRule, StoppingSettings

# A value other than the default that every owner accepts, per key
CHANGED = {
    "batch-size": 3, "local-epochs": 2, "max-local-steps": 5, "augmentation": "affine", "style-augmentation": 0.25,
    "lr": 0.01, "lr-schedule": "cosine", "lr-warmup-rounds": 2, "lr-min-factor": 0.1, "selector-lr": 0.02,
    "selector-width": 16, "selector-negatives": False, "selector-weighting": "size", "selector-moments": "averaged",
    "selector-head": "trained", "selector-shrinkage": 0.3, "personalization": "ditto", "apfl-alpha": 0.25,
    "apfl-alpha-lr": 0.5, "ditto-lambda": 0.7, "perfedavg-alpha": 0.05, "perfedavg-steps": 3, "pfedme-lambda": 2.0,
    "pfedme-k": 2, "pfedme-eta": 0.1, "softpull-lambda": 0.8, "server-optimizer": "adam", "server-lr": 0.5,
    "server-momentum": 0.4, "server-beta1": 0.8, "server-beta2": 0.95, "server-tau": 0.01,
    "step-normalization": "fednova", "site-weighting": "equal", "trim-fraction": 0.3, "krum-byzantine": 2,
    "filter-factor": 4.0, "filter-min-cosine": 0.1, "filter-memory": False, "clip-update-norm": 1.5,
    "attack": "site-1:sign-flip", "attack-scale": 2.0, "optimizer-state": "local", "extra-rounds": 4,
    "amplitude-normalization": True, "amplitude-decay": 0.2, "amplitude-window": 4, "amplitude-freeze-round": 3,
    "weight-perturbation": True, "perturbation-alpha": 0.2, "knn-k": 4, "knn-kernel-scale": 2.0, "knn-capacity": 77,
    "knn-pixels-per-image": 9, "gamma": 0.3, "gamma-selection": "fixed", "route-by": "case", "stop-window": 3,
    "stop-min-gain": 0.01, "stop-min-rounds": 4, "stop-check-every": 2, "precision": "fp32",
    "fine-tune-gamma": "validation", "min-local-steps": 4,
}
OWNED = {f.name.replace("_", "-"): f for f in dataclasses.fields(RunConfig) if "owner" in f.metadata}


def _composed(config: RunConfig, owner: type):
    """The settings object of ``owner`` that ``config`` built."""
    return {TrainingSettings: config.training_settings, LRSchedule: config.training_settings.schedule,
            FedSMSettings: config.fedsm_settings, PersonalizationSettings: config.personalization_settings,
            KNNPerSettings: config.knn_settings, HarmoFLSettings: config.harmofl_settings,
            ServerOptimizerSettings: config.server_settings,
            AggregationSettings: config.aggregation_settings, AttackSettings: config.attack_settings}.get(owner)


def test_every_owned_key_takes_its_default_from_its_owner():
    for key, field in OWNED.items():
        owner_field = {f.name: f for f in dataclasses.fields(field.metadata["owner"])}[field.metadata["field"]]
        assert field.default == owner_field.default, key
        assert owner_field.metadata["key"] == key  # the owner's error messages name the user's key


def test_every_owned_key_reaches_its_owners_field():
    # Execute: every owned key changed at once, in one run config
    # local-steps replaces local-epochs and max-local-steps, a robust aggregation excludes FedNova's
    # average, and final fine-tuning needs a fixed number of rounds, so each is changed on its own below
    alone = {"local-steps", "aggregation", "fine-tune-passes"}
    assert set(CHANGED) | alone == set(OWNED), "CHANGED must cover every owned key"
    config = RunConfig.from_mapping({"strategy": "fedsm", "num-server-rounds": 10, "aggregation": "mean", **CHANGED})

    # Assert: each owner's field holds the changed value
    for key, value in CHANGED.items():
        owner, name = OWNED[key].metadata["owner"], OWNED[key].metadata["field"]
        if owner is StoppingSettings:
            assert getattr(config.stopping_rule, name) == value, key
            continue
        assert getattr(_composed(config, owner), name) == value, key
    assert config.stopping_rule == StoppingRule(min_rounds=4, max_rounds=10, window=3, min_gain=0.01, check_every=2)
    assert config.knn_settings.seed == config.seed
    assert RunConfig.from_mapping({"local-steps": 6}).training_settings.local_steps == 6
    assert RunConfig.from_mapping({"aggregation": "median"}).aggregation_settings.name == "median"
    assert RunConfig.from_mapping({"fine-tune-passes": 7}).fedsm_settings.fine_tune_passes == 7


def test_round_settings_join_training_fedsm_personalization_and_harmofl():
    config = RunConfig.from_mapping({"strategy": "harmofl", "lr": 0.01, "lr-schedule": "cosine",
                                     "num-server-rounds": 5, "local-steps": 7, "seed": 2})
    settings = config.round_settings(5, 3)
    assert (settings.local_epochs, settings.max_local_steps) == (7, 7)  # local-steps: S passes capped at S steps
    assert settings.lr == pytest.approx(0.0)  # the cosine's floor (lr-min-factor 0) in the last round
    assert settings.perturbation_alpha == 0.05  # HarmoFL turns weight perturbation on
    assert settings.seed == 2 * 1_000_003 + 5 * 101 + 3
    assert RunConfig.from_mapping({"min-local-steps": 8}).round_settings(1, 0).min_local_steps == 8


def test_harmofl_turns_on_both_halves_and_other_strategies_only_on_request():
    assert RunConfig.from_mapping({"strategy": "harmofl"}).harmofl_settings.amplitude_normalization
    plain = RunConfig.from_mapping({"strategy": "fedavg"}).harmofl_settings
    assert (plain.amplitude_normalization, plain.active_perturbation_alpha) == (False, 0.0)
    added = RunConfig.from_mapping({"strategy": "fedavg", "weight-perturbation": True}).harmofl_settings
    assert added.active_perturbation_alpha == 0.05


@pytest.mark.parametrize(("values", "match"), [
    ({"local-steps": 4, "local-epochs": 2}, "local-steps = 4 sets every site's number"),
    ({"min-local-steps": 8, "max-local-steps": 4}, "min-local-steps = 8 conflicts with local-steps = 0 and max-local"),
    ({"min-local-steps": 8, "local-steps": 4}, "min-local-steps = 8 conflicts with local-steps = 4"),
    ({"pfedme-eta": 0.5, "pfedme-lambda": 15.0}, "pfedme-eta . pfedme-lambda = 0.5 . 15.0 is above 1"),
    ({"server-optimizer": "sgd"}, "server-optimizer = 'sgd' is not one of"),
    ({"knn-k": 0}, r"knn-k = 0 is outside \[1, 10000\]"),
    ({"aggregation": "median", "step-normalization": "fednova"}, "aggregation = 'median' with step-normalization"),
])
def test_a_subsystems_refusal_names_the_key_and_where_to_set_it(values, match):
    with pytest.raises(ValueError, match=match + r".*; set it in \[tool.flwr.app.config\]"):
        RunConfig.from_mapping(values)


@dataclasses.dataclass(frozen=True)
class _Example:
    size: int = setting(4, "example-size", low=1, high=8)
    kind: str = setting("a", "example-kind", choices=("a", "b"))
    note: float = setting(0.5, "example-note", low=0.0, high=1.0, allowed="[0, example-size]")
    free: int = 0

    def __post_init__(self) -> None:
        check_settings(self)


def test_setting_fields_check_themselves_and_print_their_allowed_values():
    fields = {f.name: f for f in dataclasses.fields(_Example)}
    assert [allowed_values(fields[name]) for name in ("size", "kind", "note", "free")] == [
        "[1, 8]", "`a`, `b`", "[0, example-size]", ""]
    with pytest.raises(ValueError, match=r"example-size = 9 is outside \[1, 8\]"):
        _Example(size=9)
    with pytest.raises(ValueError, match=r"example-kind = 'c' is not one of \['a', 'b'\]"):
        _Example(kind="c")
    with pytest.raises(ValueError, match=r"example-note = nan is outside"):
        _Example(note=float("nan"))
    assert _Example(free=-5).free == -5  # a plain field is not checked
