"""The simulation's federation config for 0, 1 and 2 visible GPUs (GPU count mocked), and bad settings."""

from __future__ import annotations

import shlex

import pytest
import torch

from fedsm_core.command_line import simulation_resources as resources
from fedsm_core.command_line.simulation_resources import gpu_share, plan_resources


@pytest.mark.parametrize(
    ("gpus", "ray_cpus", "share", "concurrent"),
    [
        (0, 2, 0.0, 2),  # no GPU: clients train on the CPU
        (1, 16, 0.1666, 6),  # 6 clients on one GPU: 1/6 rounded down so six fit (6 * 0.1666 = 0.9996)
        (2, 16, 0.3333, 6),  # 6 clients on two GPUs: three per GPU
        (2, 3, 0.5, 3),  # 3 clients on two GPUs: 2/3 each would fit only one per GPU; 1/2 fits all three
        (2, 1, 1.0, 1),  # fewer clients than GPUs: one whole GPU each
    ],
)
def test_auto_share_lets_the_clients_running_at_once_split_the_gpus(gpus, ray_cpus, share, concurrent):
    # Execute
    plan = plan_resources(num_supernodes=6, ray_cpus=ray_cpus, client_cpus=1, client_gpus="auto", visible_gpus=gpus)

    # Assert
    assert plan.client_gpus == share
    assert plan.concurrent_clients == concurrent
    assert plan.federation_config() == (f"num-supernodes=6 client-resources-num-cpus=1 client-resources-num-gpus="
                                        f"{share:g} init-args-num-cpus={min(ray_cpus, 6)}")


def test_ray_gets_no_more_cpus_than_the_clients_can_use():
    # 16 cores, 6 sites of 2 CPUs each: 12 CPUs, so Flower starts 6 workers, not 8
    plan = plan_resources(6, 16, 2, "auto", 0)
    assert plan.ray_cpus == 12 and plan.concurrent_clients == 6


@pytest.mark.parametrize(("clients", "gpus"), [(6, 1), (7, 1), (12, 5), (3, 2), (9999, 7)])
def test_every_share_fits_the_clients_in_ray_units(clients, gpus):
    share = gpu_share(gpus, clients)
    units = round(share * resources.RESOURCE_UNIT)
    # Ray packs shares per GPU: each GPU takes floor(10000 / units) clients
    assert gpus * (resources.RESOURCE_UNIT // units) >= clients
    assert 0 < share <= 1.0


def test_explicit_share_is_kept_and_limits_the_clients_at_once():
    plan = plan_resources(6, 16, 1, "0.5", 1)
    assert plan.client_gpus == 0.5 and plan.concurrent_clients == 2


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"client_gpus": "0.5", "visible_gpus": 0}, r"CLIENT_GPUS = 0.5 but no GPU is visible"),
        ({"client_gpus": "1.5"}, r"CLIENT_GPUS = 1.5 must lie in \[0, 1\]"),
        ({"client_gpus": "half"}, r"CLIENT_GPUS = 'half' is not 'auto' or a number"),
        ({"client_gpus": "0.00001"}, r"below Ray's smallest share 0.0001"),
        ({"ray_cpus": 1, "client_cpus": 2}, r"RAY_CPUS = 1 is below CLIENT_CPUS = 2"),
        ({"num_supernodes": 0}, r"NUM_SUPERNODES = 0 must be at least 1"),
    ],
)
def test_bad_settings_name_the_variable(settings, match):
    arguments = {"num_supernodes": 6, "ray_cpus": 2, "client_cpus": 1, "client_gpus": "auto", "visible_gpus": 1,
                 **settings}
    with pytest.raises(ValueError, match=match):
        plan_resources(**arguments)


@pytest.mark.parametrize(("gpus", "share"), [(0, "0"), (1, "0.1666"), (2, "0.3333")])
def test_command_prints_assignments_for_the_run_script(monkeypatch, capsys, gpus, share):
    # Prepare: torch sees `gpus` GPUs; nvidia-smi is never asked when torch sees one
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(resources, "_nvidia_smi_gpus", lambda: 0)

    # Execute
    status = resources.main(["--num-supernodes", "6", "--ray-cpus", "8", "--client-cpus", "1"])

    # Assert
    out = capsys.readouterr()
    assignments = dict(line.split("=", 1) for line in out.out.splitlines())
    assert status == 0
    assert assignments["CLIENT_GPU_SHARE"] == share
    assert shlex.split(assignments["FEDERATION_CONFIG"]) == [
        f"num-supernodes=6 client-resources-num-cpus=1 client-resources-num-gpus={share} init-args-num-cpus=6"]
    assert "6 of 6 simulated clients train at once" in out.err


def test_gpus_torch_cannot_use_are_explained(monkeypatch, capsys):
    # Prepare: nvidia-smi lists 2 GPUs, torch sees none (a CPU build, or CUDA_VISIBLE_DEVICES="")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(resources, "_nvidia_smi_gpus", lambda: 2)

    # Execute
    status = resources.main(["--num-supernodes", "6", "--ray-cpus", "2", "--client-cpus", "1", "--client-gpus", "0.5"])

    # Assert
    err = capsys.readouterr().err
    assert status == 2
    assert "nvidia-smi lists 2 GPU(s) but torch sees none" in err and "CLIENT_GPUS = 0.5" in err
