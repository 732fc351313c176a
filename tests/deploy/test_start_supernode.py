"""deploy/start-supernode.sh checks SUPERNODE_DEVICE before it starts anything (no Flower process)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "start-supernode.sh"


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:one", "cuda 1"])
def test_bad_supernode_device_is_refused_before_the_node_starts(tmp_path, device):
    # Prepare: credentials and a data folder, as the script expects
    cred, data = tmp_path / "cred", tmp_path / "data"
    cred.mkdir(), data.mkdir()
    (cred / "ca.crt").write_text("x"), (cred / "supernode-east").write_text("x")
    env = {**os.environ, "SUPERNODE_DEVICE": device, "FLWR_HOME": str(tmp_path / "home")}

    # Execute
    result = subprocess.run(["bash", str(SCRIPT), str(cred), "east", str(data), "127.0.0.1:1", "1",
                             str(tmp_path / "s")],
                            env=env, capture_output=True, text=True, timeout=60)

    # Assert
    assert result.returncode == 2
    assert f"SUPERNODE_DEVICE='{device}' must be auto, cpu, cuda or cuda:N" in result.stderr
    assert not (tmp_path / "s" / "supernode-east.pid").exists()
