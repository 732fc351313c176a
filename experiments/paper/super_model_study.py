r"""Does the super model beat its parts? Per-site test tables of FedSM runs over seeds.

Usage::

    python -m experiments.paper.super_model_study --out experiments/results/super-model/synthetic-fundus \
        --seeds 0 1 2 --methods fedsm fedsm-extra --run-config "num-server-rounds=30"

Each (method, seed) is one ``flwr run`` through ``scripts/run-simulation.sh``
(:func:`experiments.runner.launch_run`), with its run folder under ``--runs``
(outside git). A run whose folder already holds test metrics is read, not run
again, so an interrupted study continues where it stopped. After every run the
study rewrites

* ``results.csv``: long format ``dataset, method, seed, site, metric, value``
  with the test Dice of the global model, each site's own personalized model
  and the super model, the selector's site accuracy and the share of images
  routed to the global model, per site and pooled, and the gamma each run chose;
* ``table.md``: mean ± std over seeds of each of these per site.

For FedSM runs the study also scores the run's saved super model
(``super_model.pt``) once more with the routing rule of ``--gamma-selection``
(default: one gamma per personalized model, chosen on the validation split;
the run's own rule is the config's ``gamma-selection``;
:func:`experiments.in_process.chosen_gamma`), as rows of method
``<method>@<rule>``. gamma plays no part in training, so this is what a run with
that rule reports, and it lets runs made with an older rule be compared.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

from experiments.in_process import chosen_gamma
from experiments.progress import over_runs
from experiments.runner import FEDERATED, ROOT, launch_run, parse_overrides, run_settings
from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import training_dataset
from fedsm_core.device import set_cpu_threads
from fedsm_core.evaluation.super_model_evaluation import evaluate_super_model
from fedsm_core.methods import METHODS
from fedsm_core.run_files.bundle import load_bundle
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, load_checkpoint
from fedsm_core.run_files.run_outputs import pool_site_metrics

METRICS = ("dice-global", "dice-personal", "dice-super", "selector-accuracy", "share-global")
HEADERS = {"dice-global": "global", "dice-personal": "own personalized", "dice-super": "super",
           "selector-accuracy": "selector accuracy", "share-global": "routed to global", "gamma": "gamma"}
TABLE_METRICS = (*METRICS, "gamma")
COLUMNS = ("dataset", "method", "seed", "site", "metric", "value")


def finished_folder(runs: Path) -> Path | None:
    """The newest run folder under ``runs`` whose metrics hold test rows, if any."""
    if not runs.is_dir():
        return None
    for folder in sorted(runs.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
        metrics = folder / "metrics.csv"
        if metrics.is_file() and any(row["split"] == "test" for row in _read(metrics)):
            return folder
    return None


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_rows(folder: Path, dataset: str, method: str, seed: int) -> list[dict[str, object]]:
    """The study's rows of one finished run: test metrics per site and pooled, and its gamma."""
    rows = [{"dataset": dataset, "method": method, "seed": seed, "site": r["site"], "metric": r["metric"],
             "value": float(r["value"])}
            for r in _read(folder / "metrics.csv") if r["split"] == "test" and r["metric"] in METRICS]
    bundle = folder / "super_model.pt"
    if bundle.is_file():
        _, info = load_bundle(bundle)
        rows.append({"dataset": dataset, "method": method, "seed": seed, "site": "pooled", "metric": "gamma",
                     "value": float(info.gamma)})
    return rows


def rescore(folder: Path, dataset: str, method: str, seed: int, rule: str) -> list[dict[str, object]]:
    """Test rows of the run's super model with gamma chosen on validation by ``rule`` (``gamma-selection``)."""
    model, info = load_bundle(folder / "super_model.pt")
    run_config = load_checkpoint(folder / CHECKPOINT_FILE)["run-config"]
    config = RunConfig.from_mapping({**run_config, "gamma-selection": rule})
    set_cpu_threads(config.torch_threads)  # more threads than free cores slows inference many times over
    source = training_dataset(config.dataset, config.held_out_site)
    sites = {name: source.load_site(i, config.image_size, config.data_scale, config.data_seed)
             for i, name in enumerate(source.site_names)}
    validation = {name: evaluate_super_model(model, i, s.val, config.batch_size * 2, gammas=GAMMA_GRID)
                  for i, (name, s) in enumerate(sites.items())}
    model.gamma = chosen_gamma(config, validation)
    test = {name: {k: v for k, v in evaluate_super_model(model, i, s.test, config.batch_size * 2).items()
                   if not isinstance(v, list)} for i, (name, s) in enumerate(sites.items())}
    test["pooled"] = pool_site_metrics(test)
    label = f"{method}@{rule}"
    return [{"dataset": dataset, "method": label, "seed": seed, "site": site, "metric": metric, "value": value}
            for site, metrics in test.items() for metric, value in metrics.items() if metric in (*METRICS, "gamma")]


def study_table(rows: list[dict[str, object]]) -> list[str]:
    """Markdown: one block per method, a row per site, a column per metric, mean ± std over seeds."""
    lines: list[str] = []
    for method in dict.fromkeys(str(r["method"]) for r in rows):
        mine = [r for r in rows if r["method"] == method]
        seeds = sorted({int(r["seed"]) for r in mine})
        sites = [s for s in dict.fromkeys(str(r["site"]) for r in mine if r["metric"] in METRICS) if s != "pooled"]
        lines += [f"**{FEDERATED.get(method, method)}** (test, seeds {seeds})", "",
                  "| site | " + " | ".join(HEADERS[m] for m in TABLE_METRICS) + " |",
                  "|---|" + "---|" * len(TABLE_METRICS)]
        for site in [*sites, "pooled"]:
            cells = [_mean_std([float(r["value"]) for r in mine if r["site"] == site and r["metric"] == metric])
                     for metric in TABLE_METRICS]
            lines.append(f"| {site} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{np.mean(values):.4f} ± {np.std(values, ddof=1):.4f}"


def write_results(out: Path, rows: list[dict[str, object]], header: str) -> None:
    """``results.csv`` and ``table.md`` of the rows so far."""
    with (out / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    (out / "table.md").write_text(header + "\n\n" + "\n".join(study_table(rows)) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["fedsm", "fedsm-extra"],
                        choices=[m for m, row in METHODS.items() if row.family == "fedsm"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--run-config", default="", help='overrides, e.g. "num-server-rounds=30 dataset=..."')
    parser.add_argument("--out", type=Path, required=True, help="where results.csv and table.md go")
    parser.add_argument("--gamma-selection", default="per-model",
                        choices=["per-model", "validation", "client-average", ""],
                        help="also score FedSM's saved super model with this rule ('' = no)")
    parser.add_argument("--only-finished", action="store_true",
                        help="tabulate the runs that finished and start none")
    parser.add_argument("--runs", type=Path, default=None, help="run folders (default: runs/<name of --out>)")
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.run_config)
    dataset = RunConfig.from_mapping(overrides).dataset  # fails here, before any run, on a bad setting
    runs = args.runs or ROOT / "runs" / f"study-{args.out.name}"
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(method, seed) for seed in args.seeds for method in args.methods]
    rows: list[dict[str, object]] = []
    started = time.monotonic()
    for done, (method, seed) in enumerate(over_runs(jobs, "super-model study")):
        folder_runs = runs / f"{method}-seed{seed}"
        folder = finished_folder(folder_runs)
        if folder is None and args.only_finished:
            print(f"[study] {method} seed {seed}: no finished run under {folder_runs}; skipped", flush=True)
            continue
        if folder is None:
            folder = launch_run(run_settings(method, seed, overrides), folder_runs, f"study {method} seed {seed}")
        rows += test_rows(folder, Path(dataset).stem, method, seed)
        if not METHODS[method].extra_selector and args.gamma_selection:  # FedSM-extra has no gamma
            rows += rescore(folder, Path(dataset).stem, method, seed, args.gamma_selection)
        write_results(args.out, rows,
                      f"Command: `python -m experiments.paper.super_model_study {' '.join(argv or sys.argv[1:])}`")
        elapsed = time.monotonic() - started
        print(f"[study] {done + 1}/{len(jobs)} runs done ({elapsed:.0f} s); {folder}", flush=True)
    print("\n".join(study_table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
