"""Can a site approve the app it runs, offline, with Flower 1.42? What `--trusted-entities` really does.

Fed-BioMed makes each hospital approve a training plan by its hash before running it.
Flower 1.42's nearest feature is the SuperNode's `--trusted-entities`: it runs a FAB only
with a signature record, and the SuperLink attaches such records only to apps fetched from
the online Flower Hub. This test pins what the README's threat model says: a FAB submitted
with `flwr run` is refused by a SuperNode with trusted entities (whatever they are) before
any of its code runs, while a SuperNode without them runs it. So the option turns all
locally submitted runs off; it is not an approval list.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.deploy_harness import PRIVATE_HOST, PUBLIC_HOST, free_ports, write_probe_app

pytestmark = pytest.mark.deployment

CONNECTION = "loopback"
RUN_TIMEOUT_S = 300


def _wait_for_text(path: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text():
            return
        time.sleep(0.5)
    raise AssertionError(f"'{text}' not in {path} after {timeout} s")


def test_trusted_entities_refuse_every_locally_submitted_app_before_it_runs(deployment, tmp_path):
    # Arrange: two registered sites; "south" trusts an Ed25519 key (as --trusted-entities asks), "north" trusts none
    deployment.make_credentials("north", "south")
    superlink_port, public_port, north_port, south_port = free_ports(4)
    public = f"{PUBLIC_HOST}:{public_port}"
    deployment.start_superlink_behind_proxy(superlink_port, public_port)
    deployment.script("register-sites.sh", str(deployment.cred), CONNECTION, f"{PRIVATE_HOST}:{superlink_port}",
                      "north", "south", operator=True)
    data = tmp_path / "data"
    data.mkdir()
    assert "is connected" in deployment.start_supernode("north", data, public, north_port).stdout
    signer = tmp_path / "approver"
    deployment.run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(signer))
    trusted = tmp_path / "trusted-entities.yaml"
    approver_key = signer.with_suffix(".pub").read_text().strip()
    trusted.write_text(f"fpk_00000000-0000-0000-0000-000000000001: '{approver_key}'\n")
    south = tmp_path / "node-south"
    deployment.popen(south, "supernode-south", "flower-supernode", "--root-certificates",
                     str(deployment.cred / "ca.crt"), "--superlink", public, "--port", str(south_port),
                     "--auth-supernode-private-key", str(deployment.cred / "supernode-south"),
                     "--trusted-entities", str(trusted), "--node-config", "site-name='south'")
    _wait_for_text(south / "supernode-south.log", "SuperNode ID")

    # Execute: the operator runs an app that asks both sites to run its ClientApp
    app = write_probe_app(tmp_path / "app", greeting="please run me")
    marker = tmp_path / "clientapp-ran"
    result = deployment.run("flwr", "run", str(app), CONNECTION, "--stream", "--run-config",
                            f"query-nodes=2 marker='{marker}'", operator=True, timeout=RUN_TIMEOUT_S)

    # Assert: north ran the ClientApp; south refused the FAB before running any of it
    output = result.stdout + result.stderr
    assert (tmp_path / "clientapp-ran-north").is_file(), output[-3000:]
    assert not (tmp_path / "clientapp-ran-south").exists()
    assert "probe-app reply: ran" in output and "probe-app reply: The FAB could not be verified." in output
    log = (south / "supernode-south.log").read_text()
    assert "App verification is not supported by the connected SuperLink" in log, log[-3000:]
