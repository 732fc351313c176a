"""Imports only go down: a module may import its own layer or lower ones, never a higher one.

The layer order is written here once. Lowest first:

* base utilities, the table of methods (plain data, no algorithm code) and the checks that
  every settings dataclass runs;
* data (sources, preprocessing, augmentation);
* models, then the local-training loop;
* algorithms (FedSM, baselines, personalization, kNN-Per), each subsystem with its settings;
* the run configuration, which composes the subsystems' settings from the flat keys;
* evaluation (scoring a run's models on a site) and run files (run outputs, checkpoints,
  model files, bundles);
* analysis (held-out sites, calibration, model scores, pooled training);
* entry points of the core: inference (``fedsm predict``), the run report, and the command
  line (the ``fedsm`` command, the settings check, simulation resources);
* the message protocol of the two apps, then the apps, then experiments.

Layers are folders (and the few root modules); a module that matches no layer fails the
test, so a new folder is placed on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS: tuple[tuple[str, ...], ...] = (
    # fedsm_core's root holds only what every layer uses
    ("fedsm_core.device", "fedsm_core.metrics", "fedsm_core.losses", "fedsm_core.methods", "fedsm_core.checks",
     "fedsm_core.__init__"),
    ("fedsm_core.data",),
    ("fedsm_core.models",),
    ("fedsm_core.training",),
    ("fedsm_core.algorithms",),
    ("fedsm_core.config",),
    ("fedsm_core.evaluation", "fedsm_core.run_files"),
    ("fedsm_core.analysis",),
    ("fedsm_core.inference", "fedsm_core.report", "fedsm_core.command_line"),
    ("app_protocol",),
    ("server_app", "client_app"),
    ("experiments",),
)
PACKAGES = ("fedsm_core", "app_protocol", "server_app", "client_app", "experiments")
# The two apps are one layer but never import each other: what both need lives in app_protocol.
SEPARATE = (("server_app", "client_app"), ("client_app", "server_app"))


def layer_of(module: str) -> int | None:
    """Index of the layer whose longest prefix matches ``module``; ``None`` when no layer holds it."""
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    return None if best is None else best[0]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def imported_modules(path: Path) -> set[str]:
    """Every project module ``path`` imports, at the top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def project_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def test_every_module_has_a_layer():
    unplaced = [module_name(path) for path in project_files() if layer_of(module_name(path)) is None]
    assert not unplaced, f"modules in no layer (add them to LAYERS in {Path(__file__).name}): {unplaced}"


def test_no_import_climbs_a_layer():
    climbing = []
    for path in project_files():
        importer = module_name(path)
        own = layer_of(importer)
        for imported in imported_modules(path):
            target = layer_of(imported)
            if own is not None and target is not None and target > own:
                climbing.append(f"{importer} (layer {own}) imports {imported} (layer {target})")
    assert not climbing, "imports that climb a layer:\n" + "\n".join(climbing)


@pytest.mark.parametrize(("importer", "forbidden"), SEPARATE)
def test_apps_do_not_import_each_other(importer, forbidden):
    offending = [f"{module_name(path)} imports {name}" for path in (ROOT / importer).rglob("*.py")
                 for name in imported_modules(path) if name.split(".")[0] == forbidden]
    assert not offending, offending


def test_the_checker_sees_a_climbing_import(tmp_path):
    # The rule must be able to fail: a data module importing an algorithm is caught.
    assert layer_of("fedsm_core.data.augment") < layer_of("fedsm_core.algorithms.fedsm.fedsm")
    assert layer_of("fedsm_core.models.weights") < layer_of("fedsm_core.algorithms.aggregation")
    assert layer_of("fedsm_core.analysis.pooled") > layer_of("fedsm_core.evaluation.super_model_evaluation")
    assert layer_of("fedsm_core.config") > layer_of("fedsm_core.data.augment")
