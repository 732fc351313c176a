"""Who can reach what of a deployed SuperLink, on loopback: the hole, its closing, key rotation.

A "stranger" holds only ca.crt (public) and the address the SuperNodes use, and has its
own Flower home. With the recipe of the deploy/ scripts before the proxy (one SuperLink
port open to everyone) it enrols its own SuperNode key, lists runs and nodes, submits a run
of another app and talks to the Runtime API. Behind deploy/start-proxy.sh every attempt is
refused, while registered SuperNodes still connect through the proxy with TLS and node
authentication, an unregistered or revoked key is still refused, and the operator still
submits runs from the SuperLink machine. 127.0.0.1 stands for the SuperLink machine,
127.0.0.2 for its public address.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest
from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=no-name-in-module
from flwr.supercore.auth import create_superexec_auth_metadata, derive_auth_secret
from support.deploy_harness import (
    PRIVATE_HOST,
    PUBLIC_HOST,
    Deployment,
    fleet_self_register,
    free_ports,
    post,
    require_tools,
    write_probe_app,
)

pytestmark = pytest.mark.deployment

CONNECTION = "loopback"  # the operator's connection, on the SuperLink machine
STRANGER = "stranger"  # the stranger's connection, to the public address
ACQUIRE_TASK = "/v1/runtime/acquire-task"
RUN_TIMEOUT_S = 300


def _wait_for_port(address: str, timeout: float = 60) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"nothing accepts connections on {address} after {timeout} s")


def _stranger_attempts(deployment: Deployment, home: Path, address: str) -> dict[str, object]:
    """Everything the stranger tries at ``address``: each command's result, and the Runtime API's answer."""
    deployment.add_connection(home, STRANGER, address)
    app = write_probe_app(deployment.tmp / "stranger-app", greeting="not the operator's code")
    as_stranger = {"home": home, "check": False}
    return {
        "register": deployment.run("flwr", "supernode", "register", "--name", "north",
                                   str(deployment.cred / "supernode-evil.pub"), STRANGER, **as_stranger),
        "list-runs": deployment.run("flwr", "ls", STRANGER, "--format", "json", **as_stranger),
        "list-nodes": deployment.run("flwr", "supernode", "list", STRANGER, "--format", "json", **as_stranger),
        "submit": deployment.run("flwr", "run", str(app), STRANGER, **as_stranger),
        "runtime": post(address, ACQUIRE_TASK, deployment.cred / "ca.crt"),
    }


def _output(result) -> str:
    return result.stdout + result.stderr


def _refused_with_404(result) -> bool:
    """Whether a flwr command failed on a 404 (with --format json, flwr exits 0 and says success: false)."""
    failed = result.returncode != 0 or '"success": false' in result.stdout
    return failed and "404 Not Found" in _output(result)


def test_todays_recipe_lets_a_stranger_enrol_list_submit_and_reach_the_runtime_api(deployment, tmp_path):
    # Arrange: the SuperLink as deploy/start-superlink.sh started it before the proxy
    # (SUPERLINK_BIND=0.0.0.0 for remote SuperNodes, ServerApps in subprocess isolation)
    deployment.make_credentials("north", "evil")
    (port,) = free_ports(1)
    cred = deployment.cred
    deployment.popen(deployment.server_state, "superlink", "flower-superlink",
                     "--ssl-ca-certfile", str(cred / "ca.crt"), "--ssl-certfile", str(cred / "server.crt"),
                     "--ssl-keyfile", str(cred / "server.key"),
                     "--enable-supernode-auth", "--disable-runtime-dependency-installation",
                     "--host", "0.0.0.0", "--port", str(port))
    _wait_for_port(f"{PRIVATE_HOST}:{port}")
    deployment.script("register-sites.sh", str(cred), CONNECTION, f"{PRIVATE_HOST}:{port}", "north", operator=True)
    (north,) = deployment.registered_nodes(CONNECTION)

    # Execute
    tried = _stranger_attempts(deployment, tmp_path / "stranger-home", f"{PUBLIC_HOST}:{port}")

    # Assert: every attempt succeeds, and the operator sees the stranger's node and run
    assert "registered successfully" in _output(tried["register"]), _output(tried["register"])
    assert tried["list-runs"].returncode == 0 and "runs" in json.loads(tried["list-runs"].stdout)
    listed = json.loads(tried["list-nodes"].stdout)["nodes"]
    assert str(north) in {node["node-id"] for node in listed}
    assert "Successfully started run" in _output(tried["submit"]), _output(tried["submit"])
    assert tried["runtime"] == 200
    assert len(deployment.registered_nodes(CONNECTION)) == 2
    runs = json.loads(deployment.run("flwr", "ls", CONNECTION, "--format", "json", operator=True).stdout)["runs"]
    assert len(runs) == 1


def test_behind_the_proxy_a_stranger_is_refused_and_registered_sites_still_connect(deployment, tmp_path):
    # Arrange: SuperLink on 127.0.0.1, nginx on the public address, one registered site
    deployment.make_credentials("north", "evil", "intruder")
    superlink_port, public_port, node_port, intruder_port = free_ports(4)
    public = f"{PUBLIC_HOST}:{public_port}"
    deployment.start_superlink_behind_proxy(superlink_port, public_port)
    deployment.script("register-sites.sh", str(deployment.cred), CONNECTION, f"{PRIVATE_HOST}:{superlink_port}",
                      "north", operator=True)
    data = tmp_path / "data"
    data.mkdir()

    # Execute: the stranger at the public address, and at the SuperLink's own port there
    tried = _stranger_attempts(deployment, tmp_path / "stranger-home", public)
    direct_port = post(f"{PUBLIC_HOST}:{superlink_port}", "/v1/control/list-runs", deployment.cred / "ca.crt")
    dodges = {path: post(public, path, deployment.cred / "ca.crt") for path in (
        "/v1/fleet/../control/list-runs", "/v1/fleet/%2e%2e/control/list-runs", "/v1/fleet/..%2fcontrol/list-runs",
        "/v1/fleet/get-run?/../../control/list-runs", "/docs", "/v1/runtime/get-nodes")}
    self_registered = fleet_self_register(public, deployment.cred / "supernode-evil", deployment.cred / "ca.crt")

    # Assert: each attempt gets 404 from nginx; the SuperLink port is closed to the public address
    for name in ("register", "list-runs", "list-nodes", "submit"):
        assert _refused_with_404(tried[name]), (name, _output(tried[name]))
    assert tried["runtime"] == 404
    assert direct_port == "ConnectionRefusedError"
    assert dodges == dict.fromkeys(dodges, 404)
    assert self_registered == 412  # the one public path: Fleet self-registration, off under SuperNode auth
    (north,) = deployment.registered_nodes(CONNECTION)  # not the stranger's key
    assert json.loads(deployment.run("flwr", "ls", CONNECTION, "--format", "json", operator=True).stdout)["runs"] == []

    # Execute / Assert: the registered site connects through the proxy; an unregistered key is refused there
    started = deployment.start_supernode("north", data, public, node_port)
    assert "is connected" in started.stdout, started.stdout + started.stderr
    assert deployment.registered_nodes(CONNECTION) == {north: "online"}
    refused = deployment.start_supernode("intruder", data, public, intruder_port, check=False)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    log = (tmp_path / "node-intruder" / "supernode-intruder.log").read_text()
    assert "Failed to activate SuperNode" in log, log[-3000:]

    # Execute / Assert: the operator submits a run from the SuperLink machine; the operator's SuperExec runs it
    app = write_probe_app(tmp_path / "operator-app", greeting="hello from the operator")
    submitted = deployment.run("flwr", "run", str(app), CONNECTION, "--stream", operator=True, timeout=RUN_TIMEOUT_S)
    (run_id,) = re.findall(r"Successfully started run (\d+)", _output(submitted))
    listed = deployment.run("flwr", "ls", CONNECTION, "--run-id", run_id, "--format", "json", operator=True)
    (run,) = json.loads(listed.stdout)["runs"]
    assert run["status"] == "finished:completed", f"{run}\n{_output(submitted)[-3000:]}"


def test_a_rotated_key_connects_and_a_revoked_key_can_no_longer_connect(deployment, tmp_path):
    # Arrange: north connected through the proxy with its first key
    deployment.make_credentials("north", "north-2")
    superlink_port, public_port, *node_ports = free_ports(5)
    public = f"{PUBLIC_HOST}:{public_port}"
    deployment.start_superlink_behind_proxy(superlink_port, public_port)
    deployment.script("register-sites.sh", str(deployment.cred), CONNECTION, f"{PRIVATE_HOST}:{superlink_port}",
                      "north", operator=True)
    (old_node,) = deployment.registered_nodes(CONNECTION)
    data = tmp_path / "data"
    data.mkdir()
    assert "is connected" in deployment.start_supernode("north", data, public, node_ports[0]).stdout

    # Execute: rotate (register the new key, start north with it), then revoke the old key
    registered = deployment.run("flwr", "supernode", "register", "--name", "north",
                                str(deployment.cred / "supernode-north-2.pub"), CONNECTION, "--format", "json",
                                operator=True)
    new_node = int(json.loads(registered.stdout)["node-id"])
    rotated = deployment.start_supernode("north", data, public, node_ports[1], key="north-2")
    deployment.run("flwr", "supernode", "unregister", str(old_node), CONNECTION, operator=True)
    old_pid = int((tmp_path / "node-north" / "supernode-north.pid").read_text())
    deadline = time.monotonic() + 60
    while Path(f"/proc/{old_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    restarted = deployment.start_supernode("north", data, public, node_ports[2], check=False)
    reregistered = deployment.run("flwr", "supernode", "register", "--name", "north",
                                  str(deployment.cred / "supernode-north.pub"), CONNECTION, operator=True, check=False)

    # Assert: the new key is online, the old one revoked: its running node stopped, and it cannot come back
    assert "is connected" in rotated.stdout, rotated.stdout + rotated.stderr
    nodes = deployment.registered_nodes(CONNECTION)
    assert nodes[new_node] == "online" and nodes[old_node] == "unregistered", nodes
    assert not Path(f"/proc/{old_pid}").exists(), "the revoked SuperNode is still running"
    assert restarted.returncode != 0, restarted.stdout + restarted.stderr
    log = (tmp_path / "node-north" / "supernode-north.log").read_text()
    assert "Failed to activate SuperNode" in log, log[-3000:]
    assert reregistered.returncode != 0 and "Public key already in use" in _output(reregistered)


def test_the_runtime_api_gives_serverapp_tasks_only_to_the_holder_of_the_superexec_secret(tmp_path):
    # Arrange: the SuperLink and the operator's SuperExec as deploy/start-superlink.sh starts them
    require_tools("openssl", "ssh-keygen")
    deployment = Deployment(tmp_path)
    try:
        deployment.make_credentials("north")
        (port,) = free_ports(1)
        deployment.state_dirs.append(deployment.server_state)
        deployment.script("start-superlink.sh", str(deployment.cred), str(deployment.server_state), str(port),
                          operator=True)
        secret = (deployment.server_state / "superexec.secret").read_bytes()
        request = AcquireTaskRequest()

        def acquire(master_secret: bytes | None) -> int | str:
            headers = {} if master_secret is None else create_superexec_auth_metadata(
                auth_secret=derive_auth_secret(master_secret), method="/flwr.proto.Runtime/AcquireTask",
                request=request)
            return post(f"{PRIVATE_HOST}:{port}", ACQUIRE_TASK, deployment.cred / "ca.crt", headers,
                        request.SerializeToString())

        # Execute
        unsigned, wrong, right = acquire(None), acquire(b"not-the-secret"), acquire(secret)
    finally:
        deployment.stop_all()

    # Assert: only a request signed with the file's secret is served
    assert (unsigned, wrong, right) == (401, 401, 200)
    assert len(secret) == 64 and (deployment.server_state / "superexec.secret").stat().st_mode & 0o077 == 0
