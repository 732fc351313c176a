"""Where a run's memory sits: each process's role, RSS, PSS and anonymous memory, and the import cost.

Summed RSS counts a shared library's pages once for every process that maps
it, so torch's libraries count once per Ray worker. ``/proc/PID/smaps_rollup``
also gives PSS, which splits each shared page between the processes that map
it (the PSS sum is the memory a run really occupies), and the anonymous
memory (heap, tensors, decoded messages, allocator arenas), which is each
process's own. :func:`process_role` names a process from its command line so
that a report can group them: the ServerApp with the simulation engine, the
ClientApp workers, the SuperLink and so on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

KIB = 1024
# The steps of :func:`import_cost`, each importing one more module into the same fresh process.
IMPORT_STEPS = (("python", ""), ("torch", "torch"), ("torchvision", "torchvision"),
                ("segmentation_models_pytorch (with timm)", "segmentation_models_pytorch"), ("flwr", "flwr"),
                ("client_app.app (the ClientApp)", "client_app.app"))
SERVER_APP = "ServerApp + simulation engine"
CLIENT_APP = "ClientApp worker"
RAY_SERVICES = "Ray services"
# Report order of the roles.
ROLES = (SERVER_APP, CLIENT_APP, "SuperLink", "SuperExec", "flwr run", RAY_SERVICES, "other")
# Programs (an executable's or a Python script's file name) and their role.
PROGRAM_ROLES = {"flwr-simulation": SERVER_APP, "flower-superlink": "SuperLink", "flower-superexec": "SuperExec"}


@dataclasses.dataclass(frozen=True)
class ProcessMemory:
    """Memory of one process, in bytes, from its ``smaps_rollup``."""

    pid: int
    role: str
    rss: int
    pss: int
    anon: int


def _program(argv: list[str]) -> tuple[str, list[str]]:
    """The program's full path and its arguments: the script for a Python interpreter, else ``argv[0]``."""
    if Path(argv[0]).name.startswith("python"):
        rest = argv[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":  # interpreter options such as -u
            rest = rest[1:]
        if rest[:1] == ["-m"]:
            return rest[1] if len(rest) > 1 else "", rest[2:]
        if rest:
            return rest[0], rest[1:]
    return argv[0], argv[1:]


def process_role(argv: list[str]) -> str:
    """The role of a process of a ``flwr run`` simulation, from its command line.

    Ray renames its workers with setproctitle (``ray::ClientAppActor``,
    ``ray::IDLE``, ``ray::DashboardAgent``): a ``ray::`` name other than the
    ClientApp actor is counted with the Ray services, as is any program under
    Ray's package folder (``gcs_server``, ``raylet``, the dashboard, agents,
    log monitor and autoscaler monitor).
    """
    argv = [a for a in argv if a]
    if len(argv) == 1 and " " in argv[0]:  # a retitled process: one string padded with spaces
        argv = argv[0].split()
    if not argv:
        return "other"
    if argv[0].startswith("ray::"):
        return CLIENT_APP if argv[0].startswith("ray::ClientAppActor") else RAY_SERVICES
    program, arguments = _program(argv)
    name = Path(program).name
    if name in PROGRAM_ROLES:
        return PROGRAM_ROLES[name]
    if name == "flwr" and arguments[:1] == ["run"]:
        return "flwr run"
    if "/ray/" in program or program.startswith("ray."):
        return RAY_SERVICES
    return "other"


def parse_smaps_rollup(text: str) -> dict[str, int]:
    """``rss``, ``pss`` and ``anon`` (the ``Anonymous`` line) in bytes from ``/proc/PID/smaps_rollup`` text.

    Raises
    ------
    ValueError
        When one of the three lines is missing (a kernel before 4.14 has no smaps_rollup).
    """
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[key.strip()] = int(parts[0]) * KIB
    missing = [key for key in ("Rss", "Pss", "Anonymous") if key not in fields]
    if missing:
        raise ValueError(f"smaps_rollup text lacks {missing}; it needs Linux 4.14 or later")
    return {"rss": fields["Rss"], "pss": fields["Pss"], "anon": fields["Anonymous"]}


def read_process_memory(pid: int) -> ProcessMemory | None:
    """Role and memory of process ``pid``, or None when it ended (or is not readable) meanwhile."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        rollup = parse_smaps_rollup(Path(f"/proc/{pid}/smaps_rollup").read_text())
    except (OSError, ValueError):  # gone between the listing and the read, or an empty rollup of a zombie
        return None
    return ProcessMemory(pid, process_role(argv), **rollup)


def _report_import_steps() -> None:
    """In the child process of :func:`import_cost`: import each step's module and print the rollup after it."""
    steps = []
    for name, module in IMPORT_STEPS:
        if module:
            __import__(module)
        steps.append({"step": name, **parse_smaps_rollup(Path("/proc/self/smaps_rollup").read_text())})
    print(json.dumps(steps))


def import_cost(cwd: Path, env: dict[str, str] | None = None) -> list[dict[str, object]]:
    """RSS, PSS and anonymous bytes of a fresh Python process after each of :data:`IMPORT_STEPS`.

    The imports are cumulative (``torchvision`` is measured in a process that
    already holds ``torch``), so the difference between steps is what each adds.
    Every ClientApp worker and the ServerApp process pay the last step's figure
    before they hold any model or data.
    """
    code = "from experiments.bench.process_memory import _report_import_steps; _report_import_steps()"
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env={**os.environ, **(env or {})},
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"measuring the import cost failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
