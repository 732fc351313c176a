"""Sittings sharing one study folder: a run held by another sitting is passed over, a run waits for its source,
and two whole sittings at once train every run exactly once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

from support.study_runs import PLAN, FakeFlower, prepare_study

import experiments.study.job_claims as job_claims
import experiments.study.run_plan as study
from experiments.sittings import locked
from experiments.study.job_claims import claim_file, claim_jobs
from experiments.study.runs import RunKey, read_rows


def _job(method: str, source: RunKey | None = None) -> tuple[RunKey, dict[str, object], RunKey | None]:
    return RunKey("synthetic-fundus", method, 0, method[:4] + "0123456"), {}, source


def test_a_run_held_by_another_sitting_is_passed_over_until_it_is_released(tmp_path):
    # Prepare: another sitting holds FedAvg's claim
    fedavg, fedprox = _job("fedavg"), _job("fedprox")
    finished: set[str] = set()
    other = locked(claim_file(tmp_path, fedavg[0]), wait=False)
    assert other.__enter__()
    waits: list[str] = []

    def release(message: str) -> None:  # the other sitting gives FedAvg up while this one waits
        waits.append(message)
        other.__exit__(None, None, None)

    # Execute
    claims = claim_jobs([fedavg, fedprox], tmp_path, lambda key: key.method in finished, 0.0, release)
    order = []
    for job in claims:
        order.append(job[0].method)
        finished.add(job[0].method)

    # Assert: FedProx first (FedAvg was held), then FedAvg once released; one wait in between
    assert order == ["fedprox", "fedavg"]
    assert len(waits) == 1 and "held by another sitting" in waits[0] and "fedavg" in waits[0]


def test_a_run_waits_for_its_source_and_a_run_finished_elsewhere_is_skipped(tmp_path):
    # Prepare: FedSM trains in another sitting; FedSM-extra takes its rounds from it; FedProx finished elsewhere
    fedsm = _job("fedsm")
    extra, fedprox = _job("fedsm-extra", fedsm[0]), _job("fedprox")
    finished = {"fedprox"}

    def other_sitting_finishes(message: str) -> None:
        finished.add("fedsm")

    # Execute
    order = [job[0].method for job in claim_jobs([extra, fedprox], tmp_path, lambda key: key.method in finished,
                                                 0.0, other_sitting_finishes)]

    # Assert
    assert order == ["fedsm-extra"]
    assert "fedsm" in finished


def test_a_claim_is_held_while_its_run_trains_and_released_after(tmp_path):
    fedavg = _job("fedavg")
    claims = claim_jobs([fedavg], tmp_path, lambda key: False, 0.0)
    next(claims)
    with locked(claim_file(tmp_path, fedavg[0]), wait=False) as taken:
        assert not taken
    claims.close()
    with locked(claim_file(tmp_path, fedavg[0]), wait=False) as taken:
        assert taken


class _SlowFlower(FakeFlower):
    """A run that takes a while, so that two sittings' runs overlap."""

    def __call__(self, settings: dict[str, object], runs: Path, label: str) -> Path:
        time.sleep(0.5)
        return super().__call__(settings, runs, label)


def test_two_sittings_at_once_on_one_folder_train_every_run_exactly_once(tmp_path, monkeypatch):
    # Prepare: two seeds of the four-method plan, two sittings started together
    args, out, pooled = prepare_study(tmp_path, monkeypatch, PLAN.replace("seeds = [0]", "seeds = [0, 1]"))
    monkeypatch.setattr(job_claims, "POLL_SECONDS", 0.1)
    launchers = [_SlowFlower(), _SlowFlower()]
    errors: list[BaseException] = []

    def sitting(launch: FakeFlower) -> None:
        try:
            study.main(args, launch=launch)
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    # Execute
    threads = [threading.Thread(target=sitting, args=(launch,)) for launch in launchers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    # Assert: every federated run trained in one sitting only (a resumed run would show its resume-from)
    assert not errors and not any(thread.is_alive() for thread in threads)
    trained = Counter((c["strategy"], c["seed"]) for launch in launchers for c in launch.calls)
    assert set(trained) == {(m, s) for m in ("fedavg", "fedsm", "fedsm-extra") for s in (0, 1)}
    assert set(trained.values()) == {1}
    assert all(launch.calls for launch in launchers)  # both sittings trained: the runs were shared out
    assert sorted(call["seed"] for call in pooled) == [0, 1]
    rows = read_rows(out / "results.csv")
    assert {(r["method"], int(r["seed"])) for r in rows if r["kind"] == "test"} == \
        {(m, s) for m in ("fedavg", "centralized", "fedsm", "fedsm-extra") for s in (0, 1)}
