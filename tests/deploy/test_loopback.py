"""Deployment on loopback: the deploy/ scripts, TLS, SuperNode authentication, three sites.

A SuperLink with TLS and SuperNode authentication, three registered SuperNodes that
each name their site and data folder in their node config, and a FedSM run over a
federation spec without paths; then a SuperNode with an unregistered key must be
refused. Every process is started by the deploy/ scripts and stopped by PID with
deploy/stop.sh, also when the test fails.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedsm_core.bundle import load_bundle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_end_to_end import _write_slice_site  # noqa: E402  (the same tiny ProstateSlice sites)

pytestmark = pytest.mark.deployment

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SITES = ("north", "south", "east")
INTRUDER = "intruder"
CONNECTION = "loopback"
# Ports of the long simulations that run on the development machines: never use them.
RESERVED_PORTS = {39091, 39093, 39191, 39193, 39291, 39293, 39391, 39393}
RUN_TIMEOUT_S = 1200  # two tiny rounds took 6 min on a busy 2-core machine
STEP_TIMEOUT_S = 120
OFFLINE = {  # scripts/offline-env.sh, for the flwr commands the test runs itself
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0", "NO_ALBUMENTATIONS_UPDATE": "1",
    "HF_HUB_OFFLINE": "1",
}


def _free_ports(count: int) -> list[int]:
    """Ports the kernel hands out now (all bound at once, so they differ)."""
    sockets, ports = [], []
    try:
        while len(ports) < count:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
            if sock.getsockname()[1] not in RESERVED_PORTS:
                ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


class Deployment:
    """Runs the deploy/ scripts and flwr commands with one environment; remembers state folders."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.cred = tmp_path / "credentials"
        self.server_state = tmp_path / "superlink"  # the operator's folder, also its FLWR_HOME
        self.flwr_home = self.server_state / "flwr-home"
        self.state_dirs: list[Path] = []
        env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}  # each node its own
        env.update(OFFLINE, WAIT_S="60")
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        self.env = env

    def run(self, *args: str, timeout: float = STEP_TIMEOUT_S, operator: bool = False,
            check: bool = True) -> subprocess.CompletedProcess:
        env = {**self.env, "FLWR_HOME": str(self.flwr_home)} if operator else self.env
        result = subprocess.run(list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if check:
            assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        return result

    def script(self, name: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return self.run("bash", str(DEPLOY / name), *args, **kwargs)

    def start_supernode(self, site: str, data: Path, superlink: str, port: int, **kwargs):
        state = self.tmp / f"node-{site}"
        self.state_dirs.append(state)
        return self.script("start-supernode.sh", str(self.cred), site, str(data), superlink, str(port), str(state),
                           **kwargs)

    def stop_all(self) -> None:
        """deploy/stop.sh on every state folder; SIGKILL whatever a PID file still names."""
        for state in self.state_dirs:
            if not state.is_dir():
                continue
            try:
                subprocess.run(["bash", str(DEPLOY / "stop.sh"), str(state)], env=self.env, timeout=STEP_TIMEOUT_S,
                               capture_output=True)
            except subprocess.TimeoutExpired:
                pass
            for pidfile in state.glob("*.pid"):
                try:
                    os.kill(int(pidfile.read_text()), 9)
                except (ValueError, ProcessLookupError, PermissionError):
                    pass


@pytest.fixture
def deployment(tmp_path):
    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"'{tool}' is not installed; deploy/make-credentials.sh needs it")
    deployment = Deployment(tmp_path)
    try:
        yield deployment
    finally:
        deployment.stop_all()


def test_three_authenticated_sites_train_over_tls_and_an_unregistered_key_is_refused(deployment, tmp_path):
    # Arrange: three sites, a spec without paths, credentials (plus a key nobody registers)
    for index, name in enumerate(SITES):
        _write_slice_site(tmp_path / "data" / name, seed=index)
    spec = tmp_path / "federation.toml"
    spec.write_text("\n".join(f'[[sites]]\nname = "{n}"\nsource = "prostate-slices"\n' for n in SITES))
    deployment.script("make-credentials.sh", str(deployment.cred), *SITES, INTRUDER)
    superlink_port, *node_ports = _free_ports(1 + len(SITES) + 1)
    address = f"127.0.0.1:{superlink_port}"
    deployment.state_dirs.append(deployment.server_state)
    deployment.script("start-superlink.sh", str(deployment.cred), str(deployment.server_state), str(superlink_port),
                      operator=True)
    deployment.script("register-sites.sh", str(deployment.cred), CONNECTION, address, *SITES, operator=True)
    for site, port in zip(SITES, node_ports):
        started = deployment.start_supernode(site, tmp_path / "data" / site, address, port)
        assert "is connected" in started.stdout, started.stdout + started.stderr

    # Execute: two tiny FedSM rounds from the project folder
    runs = tmp_path / "runs"
    overrides = (f"num-server-rounds=2 max-local-steps=2 image-size=32 selector-width=8 batch-size=2 "
                 f"dataset='{spec}' output-dir='{runs}'")
    result = deployment.run("flwr", "run", ".", CONNECTION, "--stream", "--run-config", overrides,
                            timeout=RUN_TIMEOUT_S, operator=True)

    # Assert: `flwr run --stream` exits 0 even when the run fails; ask the SuperLink
    found = re.findall(r"Successfully started run (\d+)", result.stdout + result.stderr)
    assert found, result.stdout[-4000:] + result.stderr[-4000:]
    listed = deployment.run("flwr", "ls", CONNECTION, "--run-id", found[-1], "--format", "json", operator=True)
    (run,) = json.loads(listed.stdout)["runs"]
    assert run["status"] == "finished:completed", f"{run['status']}: {run['status-details']}\n{result.stdout[-4000:]}"
    (folder,) = list(runs.iterdir())
    with (folder / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["site"] for r in rows if r["split"] == "test"} == set(SITES) | {"pooled"}
    assert (folder / "summary.md").is_file()
    super_model, info = load_bundle(folder / "super_model.pt")
    assert info.site_names == SITES
    assert super_model(torch.rand(2, 3, 32, 32)).shape[-2:] == (32, 32)

    # Execute: a SuperNode whose key was never registered
    began = time.monotonic()
    refused = deployment.start_supernode(INTRUDER, tmp_path / "data" / SITES[0], address, node_ports[-1],
                                         timeout=90, check=False)

    # Assert: it exits on its own, says why, and leaves no PID file
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert time.monotonic() - began < 60
    log = (tmp_path / f"node-{INTRUDER}" / f"supernode-{INTRUDER}.log").read_text()
    assert "Failed to activate SuperNode" in log and "Exit Code: 305" in log, log[-3000:]
    assert "exited" in refused.stderr
    assert not (tmp_path / f"node-{INTRUDER}" / f"supernode-{INTRUDER}.pid").exists()
