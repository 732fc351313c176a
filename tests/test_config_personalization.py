"""Run-config keys of the personalization methods: choices, ranges, the strategy they need, pyproject order."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from fedsm_core.algorithms.personalization.settings import PersonalizationSettings
from fedsm_core.config import RunConfig

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_defaults_are_softpull_and_the_settings_mirror_the_keys():
    # Prepare
    values = {"personalization": "pfedme", "pfedme-k": 3, "pfedme-lambda": 2.0, "apfl-alpha": 0.25}

    # Execute
    config = RunConfig.from_mapping(values)
    settings = config.personalization_settings

    # Assert
    assert RunConfig().personalization == "softpull"
    assert RunConfig().personalization_settings == PersonalizationSettings()
    assert (settings.method, settings.pfedme_k, settings.pfedme_lambda, settings.apfl_alpha) == ("pfedme", 3, 2.0, 0.25)


def test_unknown_method_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"personalization = 'fedper' is not one of \['softpull', 'ft', 'apfl'"):
        RunConfig.from_mapping({"personalization": "fedper"})


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("apfl-alpha", 1.5, r"apfl-alpha = 1.5 is outside \[0.0, 1.0\]"),
        ("apfl-alpha-lr", -0.1, r"apfl-alpha-lr = -0.1 is outside"),
        ("ditto-lambda", -1.0, r"ditto-lambda = -1.0 is outside"),
        ("perfedavg-alpha", 0.0, r"perfedavg-alpha = 0.0 is outside"),
        ("perfedavg-steps", 0, r"perfedavg-steps = 0 is outside \[1, 100\]"),
        ("pfedme-lambda", -2.0, r"pfedme-lambda = -2.0 is outside"),
        ("pfedme-k", 0, r"pfedme-k = 0 is outside \[1, 100\]"),
        ("pfedme-eta", -0.5, r"pfedme-eta = -0.5 is outside"),
        ("pfedme-eta", 0.1, r"pfedme-eta \* pfedme-lambda = 0.1 \* 15.0 is above 1"),
    ],
)
def test_out_of_range_hyper_parameters_name_the_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        RunConfig.from_mapping({"personalization": "ditto", key: value})


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "scaffold"])
def test_a_method_other_than_softpull_needs_a_fedsm_strategy(strategy):
    with pytest.raises(ValueError, match=rf"personalization = 'ft' .* strategy = '{strategy}'"):
        RunConfig.from_mapping({"personalization": "ft", "strategy": strategy})


def test_fedsm_extra_accepts_a_personalization_method():
    assert RunConfig.from_mapping({"personalization": "apfl", "strategy": "fedsm-extra"}).personalization == "apfl"


def test_pyproject_lists_the_keys_in_the_order_of_the_dataclass():
    # Prepare
    with PYPROJECT.open("rb") as handle:
        declared = tomllib.load(handle)["tool"]["flwr"]["app"]["config"]

    # Execute
    defaults = RunConfig().to_mapping()

    # Assert
    assert list(declared) == list(defaults)
