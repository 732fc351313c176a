"""``docs/configuration.md`` is generated from RunConfig and the settings it composes, and is not stale."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fedsm_core.command_line import configuration_page
from fedsm_core.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python -m fedsm_core.command_line.configuration_page --out docs/configuration.md"


def test_the_committed_page_is_what_the_generator_writes():
    assert (ROOT / "docs" / "configuration.md").read_text() == configuration_page.page(), (
        f"docs/configuration.md is stale; regenerate it with: {COMMAND}")


def test_every_key_has_one_row_with_its_default_and_its_owner():
    rows = [line for line in configuration_page.page().splitlines() if line.startswith("| `")]
    keys = [f.name.replace("_", "-") for f in dataclasses.fields(RunConfig)]
    assert [row.split("`")[1] for row in rows] == keys
    page = configuration_page.page()
    assert "| `softpull-lambda` | float | `0.99` | [1/K, 1] | `FedSMSettings` |" in page
    assert "| `image-size` | int | `64` | [32, 4096], a multiple of 32 | run |" in page
    assert "| `server-lr` | float | `1.0` | [1e-08, 100] | `ServerOptimizerSettings` |" in page


def _checked_keys():
    """``(key, checking field)`` of every key whose range or words the page prints from the field itself."""
    for field in dataclasses.fields(RunConfig):
        checked, _ = configuration_page.checked_field(field)
        if checked.metadata.get("key") and not checked.metadata.get("allowed"):
            yield field.name.replace("_", "-"), checked


@pytest.mark.parametrize(("key", "checked"), list(_checked_keys()), ids=[key for key, _ in _checked_keys()])
def test_the_allowed_values_printed_are_the_ones_refused_outside(key, checked):
    # Every printed range or list of words is what RunConfig enforces, through the subsystem that owns the key
    meta = checked.metadata
    if meta["choices"]:
        bad = "no-such-word"
    elif isinstance(checked.default, bool):
        pytest.skip("a boolean has no range")
    else:
        bad = meta["high"] * 2 + 1
    with pytest.raises(ValueError, match=rf"^{key} = .*; set it in \[tool.flwr.app.config\]"):
        RunConfig.from_mapping({key: bad})


def test_a_bound_that_is_another_setting_is_printed_by_name_and_enforced():
    page = configuration_page.page()
    assert "| `stop-min-rounds` | int | `1` | [1, num-server-rounds] | `StoppingSettings` |" in page
    with pytest.raises(ValueError, match=r"stop-min-rounds = 40 is outside \[1, 30\]"):
        RunConfig.from_mapping({"num-server-rounds": 30, "stop-window": 5, "stop-min-rounds": 40})
    with pytest.raises(ValueError, match=r"amplitude-window = 33 is outside \[0, 32\]"):
        RunConfig.from_mapping({"image-size": 64, "amplitude-window": 33})


def test_a_key_without_a_meaning_is_refused(monkeypatch):
    meanings = dict(configuration_page.MEANINGS)
    del meanings["lr"]
    monkeypatch.setattr(configuration_page, "MEANINGS", meanings)
    with pytest.raises(ValueError, match=r"keys without a meaning \['lr'\]"):
        configuration_page.page()
