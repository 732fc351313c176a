"""The style a tool can check: ``ruff check`` with the rules in ``pyproject.toml`` finds nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_in_the_project():
    # Execute: the rules and their exceptions are [tool.ruff] in pyproject.toml
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)

    # Assert
    assert result.returncode == 0, f"ruff check found problems (fix them or run ruff check --fix):\n{result.stdout}"


def test_no_python_file_holds_more_than_one_concepts_worth_of_lines():
    # The style guide's ~350 lines per file (one concept per file), with a little slack.
    limit = 360
    files = [p for folder in ("fedsm_core", "server_app", "client_app", "app_protocol", "experiments", "tests")
             for p in (ROOT / folder).rglob("*.py")]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > limit}
    assert not long, f"files above {limit} lines; split them by concept: {long}"
