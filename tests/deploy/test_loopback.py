"""Deployment on loopback: the deploy/ scripts, TLS, SuperNode authentication, three sites.

A SuperLink with TLS and SuperNode authentication on 127.0.0.1, nginx forwarding its
Fleet API on the public address 127.0.0.2, three registered SuperNodes that connect
through it and each name their site and data folder in their node config, and a FedSM
run (model arrays through the proxy, the ServerApp in the operator's SuperExec) over a
federation spec without paths; then a SuperNode with an unregistered key must be refused.
Every process is started by the deploy/ scripts and stopped by PID with deploy/stop.sh,
also when the test fails.
"""

from __future__ import annotations

import csv
import json
import re
import time

import pytest
import torch
from support.deploy_harness import PRIVATE_HOST, PUBLIC_HOST, free_ports
from support.png_sites import write_slice_site  # the same tiny ProstateSlice sites as the in-process runs

from fedsm_core.run_files.bundle import load_bundle

pytestmark = pytest.mark.deployment

SITES = ("north", "south", "east")
INTRUDER = "intruder"
CONNECTION = "loopback"
RUN_TIMEOUT_S = 1200  # two tiny rounds took 6 min on a busy 2-core machine


def test_three_authenticated_sites_train_over_tls_and_an_unregistered_key_is_refused(deployment, tmp_path):
    # Arrange: three sites, a spec without paths, credentials (plus a key nobody registers)
    for index, name in enumerate(SITES):
        write_slice_site(tmp_path / "data" / name, seed=index)
    spec = tmp_path / "federation.toml"
    spec.write_text("\n".join(f'[[sites]]\nname = "{n}"\nsource = "prostate-slices"\n' for n in SITES))
    deployment.make_credentials(*SITES, INTRUDER)
    superlink_port, public_port, *node_ports = free_ports(2 + len(SITES) + 1)
    public = f"{PUBLIC_HOST}:{public_port}"
    deployment.start_superlink_behind_proxy(superlink_port, public_port)
    deployment.script("register-sites.sh", str(deployment.cred), CONNECTION, f"{PRIVATE_HOST}:{superlink_port}",
                      *SITES, operator=True)
    for site, port in zip(SITES, node_ports, strict=True):
        started = deployment.start_supernode(site, tmp_path / "data" / site, public, port)
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
    refused = deployment.start_supernode(INTRUDER, tmp_path / "data" / SITES[0], public, node_ports[-1],
                                         timeout=90, check=False)

    # Assert: it exits on its own, says why, and leaves no PID file
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert time.monotonic() - began < 60
    log = (tmp_path / f"node-{INTRUDER}" / f"supernode-{INTRUDER}.log").read_text()
    assert "Failed to activate SuperNode" in log and "Exit Code: 305" in log, log[-3000:]
    assert "exited" in refused.stderr
    assert not (tmp_path / f"node-{INTRUDER}" / f"supernode-{INTRUDER}.pid").exists()
