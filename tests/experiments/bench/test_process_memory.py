"""Each process of a run gets its role from its command line; PSS and anonymous memory come from smaps_rollup."""

from __future__ import annotations

import os

import pytest

from experiments.bench.process_memory import parse_smaps_rollup, process_role, read_process_memory

PY = "/root/.pyenv/versions/3.11.7/bin/python"
RAY = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/ray"
# (command line as /proc/PID/cmdline splits it at NUL bytes, role), from a real 6-site run
COMMAND_LINES = [
    ([PY, "/root/.pyenv/versions/3.11.7/bin/flwr-simulation", "--runtime-api-address", "127.0.0.1:39091"],
     "ServerApp + simulation engine"),
    (["ray::ClientAppActor", "", "", ""], "ClientApp worker"),
    (["ray::ClientAppActor                                "], "ClientApp worker"),  # retitled, padded
    ([PY, "/root/.pyenv/versions/3.11.7/bin/flower-superlink", "--insecure", "--simulation"], "SuperLink"),
    ([PY, "/root/.pyenv/versions/3.11.7/bin/flower-superexec", "--insecure", "--parent-pid", "11655"], "SuperExec"),
    ([PY, "/root/.pyenv/versions/3.11.7/bin/flwr", "run", ".", "--stream"], "flwr run"),
    ([f"{RAY}/core/src/ray/gcs/gcs_server", "--log_dir=/tmp/ray"], "Ray services"),
    ([f"{RAY}/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/ray/raylet"], "Ray services"),
    ([PY, f"{RAY}/dashboard/dashboard.py", "--host=127.0.0.1"], "Ray services"),
    ([PY, "-u", f"{RAY}/autoscaler/_private/monitor.py", "--logs-dir=/tmp/ray"], "Ray services"),
    ([PY, "-u", f"{RAY}/_private/log_monitor.py"], "Ray services"),
    (["ray::DashboardAgent", ""], "Ray services"),
    (["ray::IDLE", ""], "Ray services"),
    (["bash", "/work/scripts/run-simulation.sh", "image-size=64"], "other"),
    ([PY, "-m", "fedsm_core.command_line.cli", "check-config", "--app", "."], "other"),
    ([PY, "/root/.pyenv/versions/3.11.7/bin/flwr", "ls", "--run-id", "3"], "other"),  # flwr, but not flwr run
    ([], "other"),
]

ROLLUP = """560915989000-7ffd18ff6000 ---p 00000000 00:00 0                          [rollup]
Rss:               98652 kB
Pss:               59624 kB
Pss_Dirty:         54884 kB
Pss_Anon:          54884 kB
Pss_File:           4740 kB
Shared_Clean:      43768 kB
Private_Dirty:     54884 kB
Anonymous:         54880 kB
AnonHugePages:         0 kB
"""


@pytest.mark.parametrize(("argv", "role"), COMMAND_LINES)
def test_role_from_the_command_line(argv, role):
    assert process_role(argv) == role


def test_rollup_gives_rss_pss_and_anonymous_bytes():
    # 98652 kB * 1024 = 101019648 bytes; the Pss_* lines are not PSS itself, AnonHugePages not Anonymous
    assert parse_smaps_rollup(ROLLUP) == {"rss": 98652 * 1024, "pss": 59624 * 1024, "anon": 54880 * 1024}


def test_rollup_without_pss_names_what_is_missing():
    with pytest.raises(ValueError, match=r"lacks \['Pss'\]"):
        parse_smaps_rollup("Rss:  10 kB\nAnonymous:  4 kB\n")


def test_this_process_is_read_and_a_vanished_one_is_none():
    mine = read_process_memory(os.getpid())

    assert mine is not None and mine.role == "other"
    assert 0 < mine.anon <= mine.rss and 0 < mine.pss <= mine.rss
    assert read_process_memory(2**22 + 1) is None  # above Linux's largest PID: as if it ended mid-read
