"""The deploy/ scripts refuse unsafe or malformed settings before they start anything (no Flower, no nginx)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _script(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DEPLOY / name), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


@pytest.mark.parametrize("bind", ["0.0.0.0", "10.1.2.3", "::"])
def test_start_superlink_refuses_a_public_bind_that_would_expose_the_control_api(tmp_path, bind):
    # Execute
    result = _script("start-superlink.sh", str(tmp_path), str(tmp_path / "state"), "9091",
                     env={"SUPERLINK_BIND": bind})

    # Assert: it names the setting, the risk and the fix, and starts nothing
    assert result.returncode == 2, result.stderr
    assert f"SUPERLINK_BIND={bind}" in result.stderr and "deploy/start-proxy.sh" in result.stderr
    assert not list((tmp_path / "state").glob("*.pid"))


@pytest.mark.parametrize("address", ["9093", "https://fl.example.org:9093", "0.0.0.0:port"])
def test_start_proxy_refuses_a_public_address_that_is_not_host_port(tmp_path, address):
    # Execute
    result = _script("start-proxy.sh", str(tmp_path), str(tmp_path / "state"), address)

    # Assert
    assert result.returncode == 2
    assert f"PUBLIC_ADDRESS '{address}' must be host:port" in result.stderr
