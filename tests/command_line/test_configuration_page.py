"""``docs/configuration.md`` is generated from RunConfig and its checks, and is not stale."""

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


def test_every_key_has_one_row_with_its_default():
    rows = [line for line in configuration_page.page().splitlines() if line.startswith("| `")]
    keys = [f.name.replace("_", "-") for f in dataclasses.fields(RunConfig)]
    assert [row.split("`")[1] for row in rows] == keys
    assert "| `softpull-lambda` | float | `0.99` | [0, 1] |" in configuration_page.page()


def test_allowed_values_are_read_from_the_checks_that_enforce_them():
    allowed = configuration_page.checked_values()
    assert allowed["image-size"] == "[32, 4096]"
    assert allowed["stop-min-rounds"] == "[1, num-server-rounds]"  # a bound that is another setting
    assert allowed["strategy"].startswith("`fedsm`, `fedavg`")


def test_a_key_without_a_meaning_is_refused(monkeypatch):
    meanings = dict(configuration_page.MEANINGS)
    del meanings["lr"]
    monkeypatch.setattr(configuration_page, "MEANINGS", meanings)
    with pytest.raises(ValueError, match=r"keys without a meaning \['lr'\]"):
        configuration_page.page()
