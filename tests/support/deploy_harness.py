"""What the loopback deployment tests share: ports, the deploy/ scripts, flwr commands, probes.

Two loopback addresses stand for two networks: 127.0.0.1 is the SuperLink machine itself,
127.0.0.2 its public address (what the SuperNodes and any stranger reach). Every process is
started by a deploy/ script (or by `Deployment.popen`) with a PID file in a state folder
that `Deployment.stop_all` hands to deploy/stop.sh.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.proto.fleet_pb2 import RegisterNodeFleetRequest  # pylint: disable=no-name-in-module
from flwr.supercore.date import now
from flwr.supercore.primitives.asymmetric import public_key_to_bytes, sign_message

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PRIVATE_HOST = "127.0.0.1"  # the SuperLink machine
PUBLIC_HOST = "127.0.0.2"  # the SuperLink machine's public address
# Ports of the long simulations that run on the development machines: never use them.
RESERVED_PORTS = {39091, 39093, 39191, 39193, 39291, 39293, 39391, 39393}
STEP_TIMEOUT_S = 120
OFFLINE = {  # scripts/offline-env.sh, for the flwr commands the test runs itself
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0", "NO_ALBUMENTATIONS_UPDATE": "1",
    "HF_HUB_OFFLINE": "1",
}
PROBE_APP_TOML = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "probe-app"
version = "1.0.0"
dependencies = ["flwr"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "tests"

[tool.flwr.app.components]
serverapp = "probe_app:server"
clientapp = "probe_app:client"

[tool.flwr.app.config]
greeting = "{greeting}"
query-nodes = 0
marker = ""
"""
PROBE_APP_PY = '''\
"""A Flower app that is not FedSM: its ServerApp prints a line, and asks `query-nodes` nodes to run its ClientApp."""
import time
from pathlib import Path

from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    print("probe-app:", context.run_config["greeting"])
    wanted = int(context.run_config["query-nodes"])
    deadline = time.monotonic() + 60
    while len(nodes := list(grid.get_node_ids())) < wanted and time.monotonic() < deadline:
        time.sleep(0.5)
    queries = [Message(RecordDict(), message_type=MessageType.QUERY, dst_node_id=node) for node in nodes[:wanted]]
    for reply in grid.send_and_receive(queries, timeout=120):
        print("probe-app reply:", reply.error.reason if reply.has_error() else "ran")


@client.query()
def query(msg: Message, context: Context) -> Message:
    Path(str(context.run_config["marker"]) + "-" + str(context.node_config["site-name"])).write_text("ran")
    return Message(RecordDict(), reply_to=msg)
'''


def require_tools(*tools: str) -> None:
    """Skip the test, naming the tool, when one of ``tools`` is not installed."""
    for tool in tools:
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).is_file():
            pytest.skip(f"'{tool}' is not installed; the deploy/ scripts need it")


def free_ports(count: int) -> list[int]:
    """Ports the kernel hands out now on 127.0.0.1 and 127.0.0.2 (all bound at once, so they differ)."""
    sockets, ports = [], []
    try:
        while len(ports) < count:
            sock = socket.socket()
            sock.bind((PRIVATE_HOST, 0))
            sockets.append(sock)
            port = sock.getsockname()[1]
            public = socket.socket()
            try:
                public.bind((PUBLIC_HOST, port))
            except OSError:
                continue
            finally:
                public.close()
            if port not in RESERVED_PORTS:
                ports.append(port)
    finally:
        for sock in sockets:
            sock.close()
    return ports


def write_probe_app(folder: Path, greeting: str) -> Path:
    """A tiny Flower app (not FedSM) in ``folder``; its run prints ``probe-app: GREETING``.

    With ``--run-config "query-nodes=N marker='/abs/path'"`` its ServerApp sends a query to N
    nodes, whose ClientApp writes ``/abs/path-SITE`` (SITE: the node config's ``site-name``),
    and prints ``probe-app reply: ran`` or the node's error for each reply.
    """
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(PROBE_APP_TOML.format(greeting=greeting))
    (folder / "probe_app.py").write_text(PROBE_APP_PY)
    return folder


def post(address: str, path: str, ca: Path, headers: dict[str, str] | None = None, body: bytes = b"") -> int | str:
    """POST ``body`` to https://ADDRESS/PATH as sent (no path normalisation): the status, or the error's name."""
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPSConnection(host, int(port), timeout=20,
                                             context=ssl.create_default_context(cafile=str(ca)))
    try:
        connection.request("POST", path, body=body,
                           headers={"Content-Type": "application/protobuf", **(headers or {})})
        return connection.getresponse().status
    except OSError as error:
        return type(error).__name__
    finally:
        connection.close()


def fleet_self_register(address: str, private_key: Path, ca: Path) -> int | str:
    """POST /v1/fleet/register-node for the key itself, signed the way a SuperNode signs (flwr 1.42 headers)."""
    key = load_ssh_private_key(private_key.read_bytes(), None)
    public = public_key_to_bytes(key.public_key())
    timestamp = now().isoformat()
    headers = {"flwr-public-key": base64.b64encode(public).decode(), "flwr-timestamp": timestamp,
               "flwr-signature": base64.b64encode(sign_message(key, timestamp.encode())).decode()}
    body = RegisterNodeFleetRequest(public_key=public).SerializeToString()
    return post(address, "/v1/fleet/register-node", ca, headers, body)


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

    def run(self, *args: str, timeout: float = STEP_TIMEOUT_S, operator: bool = False, home: Path | None = None,
            check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a command from the project folder (as the operator, or with its own Flower home)."""
        full_env = {**self.env, **(env or {})}
        if operator or home is not None:
            full_env["FLWR_HOME"] = str(self.flwr_home if operator else home)
        result = subprocess.run(list(args), cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
        if check:
            assert result.returncode == 0, (
                f"{args}: exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        return result

    def script(self, name: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return self.run("bash", str(DEPLOY / name), *args, **kwargs)

    def make_credentials(self, *sites: str) -> None:
        """CA, server certificate valid for 127.0.0.1 and the public 127.0.0.2, one key pair per site."""
        self.script("make-credentials.sh", str(self.cred), *sites, env={"SUPERLINK_HOST": PUBLIC_HOST})

    def start_superlink_behind_proxy(self, superlink_port: int, public_port: int) -> None:
        """The fixed recipe: SuperLink and SuperExec on 127.0.0.1, nginx on the public address."""
        self.state_dirs.append(self.server_state)
        self.script("start-superlink.sh", str(self.cred), str(self.server_state), str(superlink_port), operator=True)
        self.script("start-proxy.sh", str(self.cred), str(self.server_state), f"{PUBLIC_HOST}:{public_port}",
                    str(superlink_port), operator=True)

    def start_supernode(self, site: str, data: Path, superlink: str, port: int, key: str | None = None, **kwargs):
        """deploy/start-supernode.sh for ``site``, with the key pair supernode-KEY (default: the site's)."""
        state = self.tmp / f"node-{key or site}"
        self.state_dirs.append(state)
        cred = self.cred
        if key is not None:  # start-supernode.sh takes supernode-SITE: give it the other key under that name
            cred = self.tmp / f"credentials-{key}"
            cred.mkdir(exist_ok=True)
            shutil.copy(self.cred / "ca.crt", cred / "ca.crt")
            shutil.copy(self.cred / f"supernode-{key}", cred / f"supernode-{site}")
        return self.script("start-supernode.sh", str(cred), site, str(data), superlink, str(port), str(state),
                           **kwargs)

    def popen(self, state: Path, name: str, *args: str) -> None:
        """Start ``args`` in its own session with STATE/NAME.pid and STATE/NAME.log, like the deploy/ scripts."""
        state.mkdir(parents=True, exist_ok=True)
        self.state_dirs.append(state)
        with (state / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(list(args), cwd=state, env={**self.env, "FLWR_HOME": str(state / "flwr-home")},
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        (state / f"{name}.pid").write_text(str(process.pid))

    def add_connection(self, home: Path, name: str, address: str) -> None:
        """A Flower home whose config.toml knows the connection NAME -> ADDRESS (TLS with ca.crt)."""
        self.run("flwr", "config", "list", home=home)  # writes Flower's default config.toml
        with (home / "config.toml").open("a") as handle:
            handle.write(f'\n[superlink.{name}]\naddress = "{address}"\nroot-certificates = "{self.cred / "ca.crt"}"\n')

    def registered_nodes(self, connection: str) -> dict[int, str]:
        """Node id -> status, as the operator's `flwr supernode list` reports them."""
        listed = self.run("flwr", "supernode", "list", connection, "--format", "json", operator=True)
        return {int(node["node-id"]): node["status"] for node in json.loads(listed.stdout)["nodes"]}

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
                    os.kill(int(pidfile.read_text()), signal.SIGKILL)
                except (ValueError, ProcessLookupError, PermissionError):
                    pass
