"""Fixtures shared across the test packages."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from filelock import FileLock
from flwr.supercore.task_identity import TaskIdentity

from fedsm_core.device import set_cpu_threads


def _identity(node_id: int):
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, node_id, 1
    return saved


def pytest_collection_modifyitems(items):
    """Run the modules marked ``long_module(seconds=...)`` first, longest first.

    pytest-xdist (``--dist loadfile --no-loadscope-reorder``) hands whole modules to its workers in this
    order: starting the minutes-long modules first keeps one worker from finishing alone with them at the end.
    """

    def weight(item) -> float:
        marker = item.get_closest_marker("long_module")
        return -float(marker.kwargs["seconds"]) if marker else 0.0

    items.sort(key=weight)  # stable: each module's tests keep their order


@pytest.fixture
def client_process(tmp_path, monkeypatch):
    """The identity the Flower runtime gives a ClientApp process, and per-site state in this test's folder."""
    set_cpu_threads(1)
    monkeypatch.setenv("FEDSM_SITE_STATE", str(tmp_path / "site-state"))
    saved = _identity(7)
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture
def server_process():
    """The identity the Flower runtime gives a ServerApp process (messages are stamped with it)."""
    saved = _identity(0)
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture
def in_process_app(tmp_path, monkeypatch):
    """Run the ServerApp against in-process ClientApps (``tests/support/in_process_grid.py``).

    Returns ``run(overrides, num_nodes=6, name="runs")`` -> ``(run folder, metrics rows, grid)``;
    each call writes its run folder under ``tmp_path / name`` and the sites keep their state
    in this test's folder.
    """
    from support.in_process_grid import metrics_rows, only_run_folder, run_app

    monkeypatch.setenv("FEDSM_SITE_STATE", str(tmp_path / "site-state"))

    def run(overrides, num_nodes: int = 6, name: str = "runs"):
        grid = run_app(tmp_path / name, overrides, num_nodes)
        folder = only_run_folder(tmp_path / name)
        return folder, metrics_rows(folder), grid

    return run


@dataclasses.dataclass(frozen=True)
class TinyRuns:
    """Two in-process FedSM runs on tiny generated sites: ``first`` stops after round 1, ``straight`` runs 2.

    Read-only: the pytest workers of one session share them (see :func:`tiny_fedsm`).
    """

    first: Path
    straight: Path
    straight_rows: list
    trained_site_state: Path  # the sites' state after ``first`` and ``straight``; never resume into it

    def site_state(self, folder: Path) -> Path:
        """A private copy of the sites' state under ``folder``, for a run resumed from ``first`` to find and change."""
        copy = folder / "tiny-fedsm-site-state"
        shutil.copytree(self.trained_site_state, copy)
        return copy


def _train_tiny_runs(root: Path) -> None:
    from support.in_process_grid import TINY, run_app

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDSM_SITE_STATE", str(root / "site-state"))
        run_app(root / "first", TINY.replace("num-server-rounds=2", "num-server-rounds=1"), 6)
        run_app(root / "straight", TINY, 6)
    (root / "trained").touch()


@pytest.fixture(scope="session")
def tiny_fedsm(tmp_path_factory, worker_id):
    """:class:`TinyRuns`, trained once per test session for the tests that only read or resume them.

    Under pytest-xdist each worker has its own session; the first worker to ask trains the runs into the
    session's shared temporary folder while holding a file lock, the others wait and read them (the
    pattern pytest-xdist documents for session fixtures that must run once).
    """
    from support.in_process_grid import metrics_rows, only_run_folder

    if worker_id == "master":  # no xdist: this process is the whole session
        root = tmp_path_factory.mktemp("tiny-fedsm")
        _train_tiny_runs(root)
    else:
        root = tmp_path_factory.getbasetemp().parent / "tiny-fedsm"
        with FileLock(f"{root}.lock"):
            if not (root / "trained").is_file():
                shutil.rmtree(root, ignore_errors=True)  # a worker that failed half way left this
                _train_tiny_runs(root)
    straight = only_run_folder(root / "straight")
    return TinyRuns(only_run_folder(root / "first"), straight, metrics_rows(straight), root / "site-state")
