"""Tests of the run configuration ([tool.flwr.app.config])."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import tomllib

from fedsm_core.config import RunConfig

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_defaults_parse():
    # Prepare / Execute
    from_empty = RunConfig.from_mapping({})

    # Assert
    assert from_empty == RunConfig()
    assert from_empty.strategy == "fedsm"
    assert from_empty.softpull_lambda == 0.99
    assert from_empty.image_size == 64


def test_kebab_case_keys_map_to_fields():
    # Prepare
    values = {
        "num-server-rounds": 3,
        "softpull-lambda": 0.5,
        "image-size": 96,
        "selector-lr": 0.01,
        "max-local-steps": 7,
        "output-dir": "elsewhere",
        "device": "cpu",
    }

    # Execute
    config = RunConfig.from_mapping(values)

    # Assert
    assert config.num_server_rounds == 3
    assert config.softpull_lambda == 0.5
    assert config.image_size == 96
    assert config.selector_lr == 0.01
    assert config.max_local_steps == 7
    assert config.output_dir == "elsewhere"
    assert config.device == "cpu"
    assert config.batch_size == RunConfig().batch_size  # untouched keys keep defaults


def test_to_mapping_round_trips():
    # Prepare
    config = RunConfig(gamma=0.25, seed=3)

    # Execute
    mapping = config.to_mapping()

    # Assert
    assert mapping["gamma"] == 0.25
    assert "softpull-lambda" in mapping and "softpull_lambda" not in mapping
    assert RunConfig.from_mapping(mapping) == config


def test_numeric_coercion():
    # Prepare / Execute
    config = RunConfig.from_mapping({"lr": 1, "batch-size": 16.0, "round-timeout": 60})

    # Assert
    assert config.lr == 1.0 and isinstance(config.lr, float)
    assert config.batch_size == 16 and isinstance(config.batch_size, int)
    assert isinstance(config.round_timeout, float)


def test_unknown_key_lists_valid_keys():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError,
                       match=r"unknown run-config key\(s\) \['softpull-lamda'\]; valid keys: .*'softpull-lambda'"):
        RunConfig.from_mapping({"softpull-lamda": 0.5})


def test_snake_case_key_is_unknown():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="unknown run-config key.*'num_server_rounds'"):
        RunConfig.from_mapping({"num_server_rounds": 3})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("batch-size", "8"),
        ("batch-size", 8.5),
        ("lr", "0.001"),
        ("strategy", 1),
        ("gamma", True),
        ("num-server-rounds", False),
    ],
)
def test_wrong_type_raises_type_error_naming_the_key(key, value):
    # Prepare / Execute / Assert
    with pytest.raises(TypeError, match=f"run-config '{key}'"):
        RunConfig.from_mapping({key: value})


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("softpull-lambda", 1.5, r"softpull-lambda = 1\.5 is outside"),
        ("softpull-lambda", -0.1, r"softpull-lambda = -0\.1 is outside"),
        ("image-size", 50, "image-size = 50 must be a multiple of 32"),
        ("image-size", 16, "image-size = 16 is outside"),
        ("strategy", "fedavgm", "strategy = 'fedavgm' is not one of"),
        ("dataset", "prostate", "dataset = 'prostate' is not one of"),
        ("device", "tpu", "device = 'tpu' is not one of"),
        ("precision", "fp8", r"precision = 'fp8' is not one of \['auto', 'fp32', 'bf16', 'fp16'\]"),
        ("gamma", 1.01, "gamma = 1.01 is outside"),
        ("num-server-rounds", 0, "num-server-rounds = 0 is outside"),
        ("batch-size", 0, "batch-size = 0 is outside"),
        ("lr", 0.0, "lr = 0.0 is outside"),
        ("max-local-steps", -1, "max-local-steps = -1 is outside"),
        ("local-steps", -2, "local-steps = -2 is outside"),
        ("round-timeout", 0.5, "round-timeout = 0.5 is outside"),
        ("output-dir", "", "output-dir is empty"),
    ],
)
def test_out_of_range_raises_value_error_naming_the_key(key, value, match):
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match=match):
        RunConfig.from_mapping({key: value})


@pytest.mark.parametrize("other", [{"local-epochs": 2}, {"max-local-steps": 4}])
def test_local_steps_refuses_a_second_setting_of_the_same_thing(other):
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="local-steps = 8 sets every site's number of minibatches"):
        RunConfig.from_mapping({"local-steps": 8, **other})


def test_config_is_frozen():
    # Prepare
    config = RunConfig()

    # Execute / Assert
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.gamma = 0.1  # type: ignore[misc]


def test_pyproject_config_matches_defaults_exactly():
    # Prepare
    with PYPROJECT.open("rb") as handle:
        pyproject = tomllib.load(handle)
    declared = pyproject["tool"]["flwr"]["app"]["config"]

    # Execute
    defaults = RunConfig().to_mapping()

    # Assert
    assert sorted(declared) == sorted(defaults)
    assert declared == defaults
    for key, value in declared.items():
        assert type(value) is type(defaults[key]), f"{key}: {type(value).__name__} vs {type(defaults[key]).__name__}"
    assert RunConfig.from_mapping(declared) == RunConfig()


def test_harmofl_always_uses_both_components_and_switches_add_them_elsewhere():
    def halves(config: RunConfig) -> tuple[bool, float]:
        return config.harmofl_settings.amplitude_normalization, config.harmofl_settings.active_perturbation_alpha

    assert halves(RunConfig(strategy="harmofl")) == (True, 0.05)
    assert halves(RunConfig(strategy="fedsm")) == (False, 0.0)
    switched = RunConfig.from_mapping({"strategy": "fedsm", "amplitude-normalization": True,
                                       "weight-perturbation": True, "perturbation-alpha": 0.1})
    assert halves(switched) == (True, 0.1)


@pytest.mark.parametrize("key, value", [("amplitude-decay", 0.0), ("amplitude-window", 33),
                                        ("amplitude-freeze-round", -1), ("perturbation-alpha", -0.5)])
def test_harmofl_settings_out_of_range_name_their_key(key, value):
    with pytest.raises(ValueError, match=key):
        RunConfig.from_mapping({key: value})


def test_kept_optimizer_state_is_for_every_strategy():
    for strategy in ("fedavg", "fedsm", "fedbn"):
        assert RunConfig.from_mapping({"strategy": strategy, "optimizer-state": "local"}).optimizer_state == "local"
    assert RunConfig.from_mapping({"strategy": "fedavg", "optimizer-state": "averaged"}).optimizer_state == "averaged"
    with pytest.raises(ValueError, match="optimizer-state = 'averaged' averages the Adam state of the one model"):
        RunConfig.from_mapping({"strategy": "fedsm", "optimizer-state": "averaged"})
    with pytest.raises(ValueError, match="optimizer-state = 'shared' is not one of"):
        RunConfig.from_mapping({"optimizer-state": "shared"})
