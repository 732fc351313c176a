"""Resumable study: every (dataset, seed, method) of a plan, trained to convergence, tabulated after every run.

Usage::

    python -m experiments.study.run_plan --plan experiments/plans/reference.toml --out experiments/results/reference

Run the same command again to continue: finished runs are read, not rerun
(:mod:`experiments.study.runs` keys each run by dataset, method, seed and a
hash of its settings), and a run that was interrupted continues from the
newest checkpoint of its run folders (``resume-from``). A study can so span
several sittings and machines: a run whose rows ``--out/results.csv`` already
holds (matched by its hash) counts as finished without its run folder, so a
clone with the committed CSV continues where the last sitting stopped; copy
``--out/runs/`` along to also continue the interrupted run from its checkpoint.
``--datasets``, ``--methods`` and ``--seeds`` run only part of the plan (the
other finished runs stay in the table); a run whose rounds come from another
(``rounds-from``) needs that one finished or selected too, checked before
anything trains.

Federated methods run with :func:`experiments.runner.launch_run` (one
``flwr run`` through ``scripts/run-simulation.sh``, more only when one is
interrupted), which stops itself by the plan's rule
(:class:`fedsm_core.training.stopping_rule.StoppingRule`, passed as the ``stop-*`` keys).
``centralized`` trains in this process with :func:`experiments.runner.run_pooled`
for as many passes over the data as the run it takes its rounds from
(``rounds-from``; without one, ``max-rounds``); it is not checkpointed, so an interrupted one starts over.
A method with ``reuse-rounds`` (its rounds train as its source's; only keys that act after
the last round differ, :func:`experiments.study.plan.check_reuse`) finishes the source's
checkpoint of its last round instead of training those rounds again
(:func:`experiments.study.runs.finishable_checkpoint`; the run key does not change, since the
result is the same, ``tests/server_app/test_fine_tuning_run.py``).
Each seed sets both ``seed`` and ``data-seed``, so seeds differ in their test
images wherever the dataset's split depends on ``data-seed``.

A bar on stderr counts runs done and left, with the time the rest should take
(:func:`experiments.progress.over_runs`). Writes to ``--out`` after every run: ``results.csv`` (long format,
:data:`experiments.study.runs.ROW_COLUMNS`), ``table.md`` and ``curves.png``
(:mod:`experiments.study.table`); at the start of every sitting
``commands.md`` (the commands, package versions and a log of sittings).
``run-configs.jsonl`` records the whole run config each finished run trained
with; a sitting refuses to go on while a finished run's record differs from
what the plan resolves to today (a changed default), unless told
``--rerun-stale`` or ``--keep-stale`` (:mod:`experiments.study.run_configs`).
Run folders go to ``--out/runs/`` (ignored by git).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from experiments.progress import over_runs
from experiments.runner import LAUNCHERS, ROOT, run_pooled
from experiments.sittings import describe_machine, fingerprint_packages
from experiments.study.job_claims import Job, claim_jobs, folder_lock
from experiments.study.plan import StudyPlan, load_plan
from experiments.study.run_configs import (
    Records,
    check_configs,
    checkpoint_record,
    label,
    make_record,
    read_configs,
    resolve,
    set_aside,
    write_configs,
)
from experiments.study.runs import (
    ROWS_FILE,
    Launch,
    RunKey,
    case_scores,
    chunk_seconds,
    federated_rows,
    finishable_checkpoint,
    read_rows,
    record_seconds,
    result_rows,
    run_federated,
    run_key,
    write_rows,
)
from experiments.study.table import plot_study_curves, study_table_of
from fedsm_core.analysis.image_dice import IMAGE_DICE_FILE, image_rows, model_image_dice, site_means, write_image_dice
from fedsm_core.analysis.image_dice import read_rows as read_image_rows
from fedsm_core.config import RunConfig
from fedsm_core.device import select_device, set_cpu_threads

# What trains the model, reads and resizes the data (pillow, nibabel) and scores it (scipy: HD95)
PACKAGES = ("torch", "torchvision", "timm", "segmentation-models-pytorch", "flwr", "numpy", "scipy", "pillow",
            "nibabel", "ray", "matplotlib", "tqdm")


def plan_jobs(plan: StudyPlan) -> list[Job]:
    """Every run of the plan in order: its key, its settings, and the key it takes its rounds from."""
    jobs: list[Job] = []
    keys: dict[tuple[str, int, str], RunKey] = {}
    for dataset, seed, method in plan.jobs():
        settings = {**plan.settings(dataset, method), "seed": seed, "data-seed": seed}
        source = plan.rounds_from.get(method)
        source_key = keys[(dataset, seed, source)] if source else None
        key = run_key(dataset, method, seed, plan.keyed(settings), plan.stopping, source_key)
        keys[(dataset, seed, method)] = key
        jobs.append((key, settings, source_key))
    return jobs


def finished_rows(key: RunKey, runs: Path, recorded: Sequence[Mapping[str, str]] = ()) -> list[dict[str, str]] | None:
    """The rows of a finished run, or ``None`` when it has not finished.

    Read from the run's folder, else from ``recorded`` (a study's ``results.csv``).
    """
    path = key.folder(runs) / ROWS_FILE
    if path.is_file():
        return read_rows(path)
    mine = [dict(r) for r in recorded if r["run"] == key.digest and r["method"] == key.method
            and r["dataset"] == key.dataset_label and int(r["seed"]) == key.seed]
    return mine if any(r["kind"] == "test" for r in mine) else None


def recorded_rows(out: Path) -> list[dict[str, str]]:
    """The rows of ``out/results.csv`` (``[]`` before the first run finished)."""
    return read_rows(out / "results.csv") if (out / "results.csv").is_file() else []


def source_rounds(source: RunKey | None, runs: Path, recorded: Sequence[Mapping[str, str]] = ()) -> int | None:
    """Rounds the run ``source`` trained (its test rows' round); ``None`` without a source."""
    if source is None:
        return None
    tests = [row for row in finished_rows(source, runs, recorded) or [] if row["kind"] == "test"]
    if not tests:
        raise RuntimeError(f"{source} has not finished; it runs before the methods that take its rounds")
    return int(tests[0]["round"])


def run_centralized(key: RunKey, settings: Mapping[str, object], rounds: int) -> list[dict[str, object]]:
    """Pooled training for ``rounds`` passes (``run_pooled``); its rows, with every test image scored."""
    images: list[tuple[str, str, bool, float]] = []
    cases: list[tuple[str, str, float]] = []
    config = RunConfig.from_mapping({**settings, "num-server-rounds": rounds})
    device = select_device(config.device)

    def score_images(job: str, model, sites, per_site) -> None:
        images.extend(image_rows(sites.values(), lambda i, site: model_image_dice(
            model, site.test, config.batch_size * 2, device)))
        cases.extend(case_scores({(site, metric): value for site, metrics in per_site.items()
                                  for metric, value in metrics.items()}, "dice-global"))

    began = time.monotonic()
    tests, curve = run_pooled(["centralized"], key.seed, {**settings, "num-server-rounds": rounds}, score_images)
    seconds = time.monotonic() - began
    return result_rows(key, rounds, [(str(r["site"]), float(r["value"])) for r in tests], images, curve, seconds,
                       cases)


def check_images(key: RunKey, images: list[tuple[str, str, bool, float]], rows: list[dict[str, object]]) -> None:
    """Warn when the per-image Dice does not average to what the run reported (another model or split)."""
    reported = {str(r["site"]): float(r["value"]) for r in rows if r["kind"] == "test"}
    gaps = {site: abs(mean - reported[site]) for site, mean in site_means(images).items() if site in reported}
    if not gaps or max(gaps.values()) > 1e-6:
        print(f"[study] warning: {key}: per-image test Dice does not reproduce the reported Dice {gaps}", flush=True)


def run_job(job: Job, plan: StudyPlan, runs: Path, launch: Launch,
            recorded: Sequence[Mapping[str, str]] = ()) -> list[dict[str, object]]:
    """Train one run to its end (or continue it) and write its rows; returns them."""
    key, settings, source = job
    fixed = source_rounds(source, runs, recorded)
    if key.method == "centralized":
        rows = run_centralized(key, settings, fixed or plan.stopping.max_rounds)
    else:
        start = finishable_checkpoint(source, runs, fixed) if key.method in plan.reuse_rounds else None
        final = run_federated(key, runs, settings, plan.stopping, fixed, launch, start)
        config = RunConfig.from_mapping({**settings, "num-server-rounds": 1})
        set_cpu_threads(config.torch_threads)
        path = final / IMAGE_DICE_FILE
        if not path.is_file():
            began = time.monotonic()
            write_image_dice(final, select_device(config.device))
            record_seconds(key.folder(runs), "test-images", time.monotonic() - began)
        images = read_image_rows(path)
        rows = federated_rows(key, final, images, chunk_seconds(key.folder(runs)))
        check_images(key, images, rows)
    write_rows(key.folder(runs) / ROWS_FILE, rows)
    return rows


def write_outputs(out: Path, jobs: list[Job], runs: Path) -> int:
    """``results.csv``, ``table.md`` and ``curves.png`` of the runs finished so far; returns their number."""
    recorded = recorded_rows(out)
    found = [finished_rows(key, runs, recorded) for key, _, _ in jobs]
    rows = [row for part in found if part for row in part]
    write_rows(out / "results.csv", rows)
    (out / "table.md").write_text(study_table_of(out / "results.csv"))
    plot_study_curves(out / "curves.png", read_rows(out / "results.csv"))
    return sum(1 for part in found if part)


def select_jobs(jobs: list[Job], datasets: list[str] | None, methods: list[str] | None = None,
                seeds: list[int] | None = None) -> list[Job]:
    """The plan's jobs of the named datasets (short names), methods and seeds; every one of a filter not named."""
    filters = (("--datasets", datasets, lambda key: key.dataset_label), ("--methods", methods, lambda key: key.method),
               ("--seeds", seeds, lambda key: key.seed))
    for option, wanted, field in filters:
        known = {field(key) for key, _, _ in jobs}
        unknown = sorted(set(wanted or ()) - known)
        if unknown:
            raise ValueError(f"{option}: {unknown} are not in the plan; expected some of {sorted(known)}")
    return [job for job in jobs if all(not wanted or field(job[0]) in wanted for _, wanted, field in filters)]


def check_sources(pending: list[Job], runs: Path, recorded: Sequence[Mapping[str, str]]) -> None:
    """Refuse, before anything trains, a selected run whose rounds come from a run neither finished nor selected."""
    selected = {key for key, _, _ in pending}
    for key, _, source in pending:
        if source is not None and source not in selected and finished_rows(source, runs, recorded) is None:
            raise ValueError(f"{key} takes its rounds from {source.method}, which has not finished and is not "
                             f"selected; add --methods {source.method} (or run it first)")


def settle_configs(out: Path, runs: Path, jobs: list[Job], stale: str | None) -> Records:
    """Compare every finished run's recorded run config with today's (:mod:`experiments.study.run_configs`).

    Stale runs stop the sitting before anything trains unless ``stale`` is
    ``"rerun"`` (set aside, so they train again) or ``"keep"``. Returns the
    records, filled in from the checkpoints of runs that finished unrecorded.
    """
    recorded = recorded_rows(out)
    records = read_configs(out)
    finished = {key for key, _, _ in jobs if finished_rows(key, runs, recorded) is not None}
    check = check_configs(jobs, finished, records, runs)
    if check.unchecked:
        print(f"[study] {len(check.unchecked)} finished run(s) without a recorded run config (finished before the "
              f"study recorded configs, folders gone): a default changed since would go unnoticed there: "
              f"{', '.join(map(str, check.unchecked))}", flush=True)
    if check.stale and stale is None:
        raise ValueError(f"{len(check.stale)} finished run(s) of {out} trained with another run config than the plan "
                         f"resolves to today (a default changed?), recorded -> today:\n{check.report()}\nrun again "
                         f"with --rerun-stale to train them anew (their rows move to stale-results.csv) or "
                         f"--keep-stale to tabulate them as they are")
    if check.stale:
        print(f"[study] {'training again' if stale == 'rerun' else 'keeping'} stale runs:\n{check.report()}",
              flush=True)
    for key in check.stale if stale == "rerun" else ():
        set_aside(key, runs, out, records)
    if records:
        write_configs(out, records)
    return records


def record_config(out: Path, runs: Path, job: Job, records: Records) -> None:
    """Record a run that just finished: its checkpoint's run config (what the ServerApp ran), else the resolution."""
    key, settings, _ = job
    records[label(key)] = checkpoint_record(key, runs) or make_record(key, resolve(settings), "resolved by the study")
    write_configs(out, records)


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def write_commands(out: Path, plan_path: Path, done: int, total: int, datasets: list[str] | None = None) -> Path:
    """``commands.md``: how to run, resume and tabulate; versions; one more line in the log of sittings."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    path = out / "commands.md"
    log = path.read_text().split("## Sittings\n", 1)[1].strip().splitlines() if path.is_file() and \
        "## Sittings\n" in path.read_text() else []
    log.append(f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit.stdout.strip() or '?'}, "
               f"{describe_machine()}, packages {fingerprint_packages()}: {done} of {total} runs finished at the start"
               + (f"; ran only {', '.join(datasets)}" if datasets else ""))
    lines = ["# Commands", "", "Run, or continue after an interruption (finished runs are skipped):", "",
             f"    python -m experiments.study.run_plan --plan {plan_path} --out {out}", "",
             "Regenerate the table and the curves from the CSV alone:", "",
             f"    python -m experiments.study.table --csv {out}/results.csv --out {out}/table.md "
             f"--curves {out}/curves.png", "",
             "## Versions", "", f"- python {platform.python_version()}",
             *[f"- {name} {_version(name)}" for name in PACKAGES], "", "## Sittings", "", *log, ""]
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None, launch: Launch | None = None) -> int:
    """Command-line entry point (``launch`` runs one chunk instead of ``--launcher``'s; tests replace it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="the study plan (experiments/plans/*.toml)")
    parser.add_argument("--out", type=Path, required=True, help="results folder; run folders go to its runs/")
    parser.add_argument("--only-finished", action="store_true", help="tabulate the finished runs, start none")
    parser.add_argument("--datasets", nargs="*", default=None,
                        help="run only these of the plan's datasets (short names, e.g. drishti-six-site)")
    parser.add_argument("--methods", nargs="*", default=None, help="run only these of the plan's methods")
    parser.add_argument("--seeds", nargs="*", type=int, default=None, help="run only these of the plan's seeds")
    stale = parser.add_mutually_exclusive_group()
    stale.add_argument("--rerun-stale", dest="stale", action="store_const", const="rerun",
                       help="train again the finished runs whose recorded run config differs from today's")
    stale.add_argument("--keep-stale", dest="stale", action="store_const", const="keep",
                       help="tabulate such runs as they are")
    parser.add_argument("--launcher", choices=sorted(LAUNCHERS), default="flwr-run",
                        help="how a federated run starts: flwr-run (scripts/run-simulation.sh, a Ray simulation "
                             "on every core) or in-process (the same apps in this process, one core: start one "
                             "sitting per core on the same --out)")
    args = parser.parse_args(argv)
    launch = launch or LAUNCHERS[args.launcher]
    plan = load_plan(args.plan)  # every setting is checked here, before anything trains
    runs = args.out / "runs"
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = plan_jobs(plan)
    wanted = select_jobs(jobs, args.datasets, args.methods, args.seeds)
    with folder_lock(args.out):
        records = settle_configs(args.out, runs, jobs, args.stale)
    recorded = recorded_rows(args.out)
    unfinished = [job for job in jobs if finished_rows(job[0], runs, recorded) is None]
    pending = [job for job in unfinished if job in wanted]
    check_sources(pending, runs, recorded)
    selected = len(wanted)  # progress counts these only
    done = selected - len(pending)
    only = [*(args.datasets or ()), *(args.methods or ()), *(f"seed {seed}" for seed in args.seeds or ())]
    with folder_lock(args.out):
        write_commands(args.out, args.plan, len(jobs) - len(unfinished), len(jobs), only)
    claimed = claim_jobs([] if args.only_finished else pending, runs,
                         lambda key: finished_rows(key, runs, recorded) is not None)
    for index, job in enumerate(over_runs(claimed, "study", selected, done)):
        print(f"[study] {job[0]}: run {done + index + 1} of {selected}, {len(pending) - index} left", flush=True)
        run_job(job, plan, runs, launch, recorded)
        with folder_lock(args.out):  # other sittings may share --out
            records.update(read_configs(args.out))
            record_config(args.out, runs, job, records)
            write_outputs(args.out, jobs, runs)
    with folder_lock(args.out):
        finished = write_outputs(args.out, jobs, runs)
    print(f"[study] {finished} of {len(jobs)} runs finished; results in {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
