"""Messages built outside a running Flower process need a task identity."""

from __future__ import annotations

import pytest
from flwr.supercore.task_identity import TaskIdentity


@pytest.fixture(autouse=True)
def task_identity():
    """Give this process the identity the Flower runtime would set (run 1, node 7, task 1)."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 7, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture(autouse=True)
def site_state(tmp_path, monkeypatch):
    """Per-site client state in this test's own folder (client_app.site_state)."""
    monkeypatch.setenv("FEDSM_SITE_STATE", str(tmp_path / "site-state"))
    return tmp_path / "site-state"
