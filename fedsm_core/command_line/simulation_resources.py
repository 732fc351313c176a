r"""CPUs and GPUs of a Ray simulation: how many clients train at once and what share of a GPU each gets.

Ray hides every GPU from a worker that requests none, so a simulated client
only trains on a GPU when the federation config gives it a share
(``client-resources-num-gpus``). ``scripts/run-simulation.sh`` asks this module::

    python -m fedsm_core.command_line.simulation_resources --num-supernodes 6 --ray-cpus 16 \
        --client-cpus 1 --client-gpus auto

and gets shell assignments: the ``--federation-config`` string for
``flwr run`` and the GPU share. ``auto`` gives the clients that run at once
equal shares of the visible GPUs (1/3 of a GPU each for 6 clients on 2 GPUs),
or 0 on a machine without one.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import shutil
import subprocess
import sys

# Ray counts resources in units of 1/10000: a share is rounded down to that, so n shares fit in one GPU.
RESOURCE_UNIT = 10_000


@dataclasses.dataclass(frozen=True)
class SimulationResources:
    """The resources of one simulation.

    Attributes
    ----------
    num_supernodes : int
        Simulated sites.
    ray_cpus : int
        CPUs Ray is given: at most ``num_supernodes * client_cpus``, since Flower
        starts one worker process per ``client_cpus`` CPUs and more would idle.
    client_cpus : int
        CPUs per client.
    client_gpus : float
        GPU share per client (0: clients train on the CPU).
    visible_gpus : int
        GPUs seen when the plan was made.
    """

    num_supernodes: int
    ray_cpus: int
    client_cpus: int
    client_gpus: float
    visible_gpus: int

    @property
    def concurrent_clients(self) -> int:
        """Clients that train at once: limited by the CPUs, then by the GPU shares."""
        clients = self.ray_cpus // self.client_cpus
        if self.client_gpus > 0:
            clients = min(clients, self.visible_gpus * RESOURCE_UNIT // round(self.client_gpus * RESOURCE_UNIT))
        return clients

    def federation_config(self) -> str:
        """The ``--federation-config`` value of ``flwr run``."""
        return (f"num-supernodes={self.num_supernodes} client-resources-num-cpus={self.client_cpus} "
                f"client-resources-num-gpus={self.client_gpus:g} init-args-num-cpus={self.ray_cpus}")

    def describe(self) -> str:
        """One line for the run's log."""
        where = (f"{self.client_gpus:g} of a GPU each ({self.visible_gpus} visible)" if self.client_gpus > 0
                 else "on the CPU")
        return (f"{self.concurrent_clients} of {self.num_supernodes} simulated clients train at once, "
                f"{self.client_cpus} CPU(s) and {where}; Ray has {self.ray_cpus} CPUs")


def gpu_share(visible_gpus: int, concurrent_clients: int) -> float:
    """The GPU share that lets ``concurrent_clients`` clients train at once on ``visible_gpus`` GPUs.

    ``1 / ceil(clients / gpus)``, rounded down to Ray's 1/10000 units: Ray
    packs fractional requests onto single GPUs, so 3 clients on 2 GPUs get 1/2
    each (2 on one GPU, 1 on the other) rather than 2/3, of which only one fits
    per GPU. A client never gets more than one GPU (it trains on one device).
    """
    if visible_gpus <= 0 or concurrent_clients <= 0:
        return 0.0
    per_gpu = math.ceil(concurrent_clients / visible_gpus)
    return math.floor(RESOURCE_UNIT / per_gpu) / RESOURCE_UNIT


def plan_resources(num_supernodes: int, ray_cpus: int, client_cpus: int, client_gpus: str,
                   visible_gpus: int) -> SimulationResources:
    """The resources for the given settings (``client_gpus``: ``auto`` or a number in [0, 1]).

    Raises
    ------
    ValueError
        A setting out of range, a GPU share with no GPU visible, or fewer
        CPUs than one client needs; the message names the variable to change.
    """
    if num_supernodes < 1:
        raise ValueError(f"NUM_SUPERNODES = {num_supernodes} must be at least 1")
    if client_cpus < 1:
        raise ValueError(f"CLIENT_CPUS = {client_cpus} must be at least 1")
    if ray_cpus < client_cpus:
        raise ValueError(f"RAY_CPUS = {ray_cpus} is below CLIENT_CPUS = {client_cpus}: no client could run; "
                         "raise RAY_CPUS or lower CLIENT_CPUS")
    ray_cpus = min(ray_cpus, num_supernodes * client_cpus)
    concurrent = ray_cpus // client_cpus
    if client_gpus == "auto":
        share = gpu_share(visible_gpus, concurrent)
    else:
        share = _explicit_share(client_gpus, visible_gpus)
    return SimulationResources(num_supernodes, ray_cpus, client_cpus, share, visible_gpus)


def _explicit_share(value: str, visible_gpus: int) -> float:
    try:
        share = float(value)
    except ValueError:
        raise ValueError(f"CLIENT_GPUS = '{value}' is not 'auto' or a number such as 0.25") from None
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"CLIENT_GPUS = {value} must lie in [0, 1] (a client trains on one GPU), or be 'auto'")
    if share > 0 and visible_gpus == 0:
        raise ValueError(f"CLIENT_GPUS = {value} but no GPU is visible to torch on this machine; "
                         "set CLIENT_GPUS=0 (or auto) to train on the CPU")
    if share > 0 and int(share * RESOURCE_UNIT) == 0:
        raise ValueError(f"CLIENT_GPUS = {value} is below Ray's smallest share 0.0001")
    return math.floor(share * RESOURCE_UNIT) / RESOURCE_UNIT


def visible_gpu_count() -> tuple[int, str]:
    """GPUs this process can train on, and a note when ``nvidia-smi`` lists GPUs that torch cannot use.

    torch decides (it honours ``CUDA_VISIBLE_DEVICES`` and is what trains);
    ``nvidia-smi -L`` is asked only to explain a count of 0.
    """
    import torch  # here, so that --help and the tests of the planning need no CUDA initialisation

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count > 0:
        return count, ""
    listed = _nvidia_smi_gpus()
    if listed == 0:
        return 0, ""
    return 0, (f"nvidia-smi lists {listed} GPU(s) but torch sees none (CUDA_VISIBLE_DEVICES="
               f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r}, torch {torch.__version__}); "
               "clients train on the CPU")


def _nvidia_smi_gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())


def main(argv: list[str] | None = None) -> int:
    """Print ``FEDERATION_CONFIG=...`` and ``CLIENT_GPU_SHARE=...`` for the run script's ``eval``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-supernodes", type=int, required=True)
    parser.add_argument("--ray-cpus", type=int, required=True)
    parser.add_argument("--client-cpus", type=int, required=True)
    parser.add_argument("--client-gpus", default="auto")
    args = parser.parse_args(argv)
    visible, note = visible_gpu_count()
    if note:
        print(f"simulation resources: {note}", file=sys.stderr)
    try:
        plan = plan_resources(args.num_supernodes, args.ray_cpus, args.client_cpus, args.client_gpus, visible)
    except ValueError as error:
        print(f"simulation resources: {error}", file=sys.stderr)
        return 2
    print(f"simulation resources: {plan.describe()}", file=sys.stderr)
    print(f"FEDERATION_CONFIG={shlex.quote(plan.federation_config())}")
    print(f"CLIENT_GPU_SHARE={plan.client_gpus:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
