"""The install files agree: pyproject's bounds, the lock, and the versions the committed results record."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+)$")


def locked_versions() -> dict[str, Version]:
    """Package -> pinned version of ``requirements/lock.txt``."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        match = PIN.match(line.strip())
        if match:
            pins[canonicalize_name(match.group(1))] = Version(match.group(2))
    return pins


def declared_requirements() -> list[Requirement]:
    """The project's dependencies and test extra from ``pyproject.toml``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in [*project["dependencies"], *project["optional-dependencies"]["test"]]]


def test_the_lock_pins_every_requirement_within_its_bounds():
    pins = locked_versions()
    outside = {str(req): str(pins.get(canonicalize_name(req.name))) for req in declared_requirements()
               if canonicalize_name(req.name) not in pins
               or not req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True)}
    assert not outside, f"requirements/lock.txt is stale, regenerate it with the command in its header: {outside}"


def test_the_lock_records_the_versions_the_reference_study_ran_on():
    # Prepare: the "## Versions" list of the study's commands.md ("- torch 2.14.1")
    text = (ROOT / "experiments" / "results" / "reference" / "commands.md").read_text()
    section = text.split("## Versions", 1)[1].split("##", 1)[0]
    recorded = dict(re.findall(r"^- (\S+) (\S+)$", section, flags=re.MULTILINE))
    pins = locked_versions()

    # Assert: every recorded package (python aside) is locked at the recorded version
    recorded.pop("python")
    assert recorded, "commands.md lists no versions"
    assert {name: str(pins.get(canonicalize_name(name))) for name in recorded} == recorded


def test_every_bound_in_pyproject_has_its_reason_beside_it():
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    start = lines.index("dependencies = [")
    end = lines.index("]", start)
    for index in range(start + 1, end):
        line = lines[index].strip()
        bounded = line.startswith('"') and re.search(r"[<>=!~]=?\d", line)
        explained = "#" in line or lines[index - 1].strip().startswith("#")
        assert not bounded or explained, f"pyproject.toml line {index + 1}: {line} has a bound without a reason"
