"""fedsm_core must run without Flower: no module of it may import ``flwr``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "fedsm_core"
FRAMEWORK = "flwr"


def _is_framework(module: str | None) -> bool:
    return module is not None and (module == FRAMEWORK or module.startswith(FRAMEWORK + "."))


def framework_imports(source: str, filename: str = "<source>") -> list[str]:
    """Every ``import flwr...`` / ``from flwr... import`` in ``source``, as ``line: statement``."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {alias.name}" for alias in node.names if _is_framework(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_framework(node.module):
            found.append(f"{node.lineno}: from {node.module} import ...")
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _is_framework(node.args[0].value)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            found.append(f"{node.lineno}: dynamic import of {node.args[0].value}")
    return found


CORE_FILES = sorted(CORE.rglob("*.py"))


def test_core_has_python_files():
    # Prepare / Execute / Assert
    assert CORE.is_dir()
    assert len(CORE_FILES) > 5
    assert CORE / "__init__.py" in CORE_FILES


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(CORE)))
def test_module_does_not_import_flwr(path):
    # Prepare
    source = path.read_text(encoding="utf-8")

    # Execute
    found = framework_imports(source, str(path))

    # Assert
    assert found == [], f"{path.relative_to(CORE.parent)} imports {FRAMEWORK}: {found}"


@pytest.mark.parametrize(
    ("source", "count"),
    [
        ("import flwr", 1),
        ("import numpy, flwr.common as fc", 1),
        ("from flwr.common import Context", 1),
        ("def f():\n    from flwr import serverapp\n", 1),
        ("import importlib\nimportlib.import_module('flwr.client')", 1),
        ("__import__('flwr')", 1),
        ("import flwrx\nfrom flowers import flwr\nfrom . import flwr\n# import flwr\nx = 'import flwr'", 0),
    ],
)
def test_detector_finds_framework_imports(source, count):
    # Prepare / Execute
    found = framework_imports(source)

    # Assert
    assert len(found) == count, found
