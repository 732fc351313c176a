"""The README's run script (``scripts/run-simulation.sh``: ``flwr run .`` on a local SuperLink) from a test.

Every call gets free ports of its own, so a SuperLink the user already runs is
never used or disturbed, and tests running at once never share one.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from support.deploy_harness import free_ports

ROOT = Path(__file__).resolve().parents[2]


def run_simulation(folder: Path, overrides: str, **extra_env: str) -> subprocess.CompletedProcess:
    """``scripts/run-simulation.sh overrides`` with Flower's state and the run folders under ``folder``."""
    http_port, control_port = free_ports(2)
    env = {**os.environ, "FLWR_HOME": str(folder / "flwr-home"), "FEDSM_RUNS": str(folder / "runs"),
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port), "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
           **extra_env}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(["bash", str(ROOT / "scripts" / "run-simulation.sh"), overrides],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def superlinks(folder: Path) -> str:
    """The SuperLink processes still running on ``folder``'s Flower state (none after a run)."""
    found = subprocess.run(["pgrep", "-af", f"--database {folder / 'flwr-home'}"], capture_output=True, text=True)
    return found.stdout.strip()


def finished_run(folder: Path, result: subprocess.CompletedProcess) -> tuple[Path, list[dict[str, str]]]:
    """Check the run succeeded and wrote one run folder; return it and its metrics rows."""
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (run_folder,) = list((folder / "runs").iterdir())
    with (run_folder / "metrics.csv").open() as handle:
        return run_folder, list(csv.DictReader(handle))
