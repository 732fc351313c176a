r"""FedSM's personalization studies: the paper's Table 6 (methods) and Table 7 (SoftPull lambda).

Usage::

    python -m experiments.paper.personalization_study --table 6 --out results/table6-fundus \
        --run-config "num-server-rounds=10 eval-every=5 lr=0.005"
    python -m experiments.paper.personalization_study --table 7 --out results/table7-prostate \
        --run-config "dataset='synthetic-prostate' num-server-rounds=10 eval-every=5 lr=0.005"

Every variant is one ``flwr run`` of FedSM (``scripts/run-simulation.sh``)
that differs from the others only in how the personalized models are
trained: ``personalization`` (Table 6) or ``softpull-lambda`` (Table 7).
Each variant is scored on every site's test split twice: with the super
model (what FedSM deploys, gamma chosen on validation) and with each site's
own personalized model (the personalization method on its own, as if the
selector were perfect).

Writes to ``--out``: ``results.csv`` (long format), ``table.md`` (both
scores, mean ± std over seeds, per site, client average and pooled; wall
time per variant).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from experiments.paper.comparison_table import comparison_table, write_long_csv
from experiments.progress import over_runs
from experiments.runner import launch_run, parse_overrides
from fedsm_core.algorithms.personalization.settings import PERSONALIZATIONS
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import training_dataset

ROOT = Path(__file__).resolve().parents[2]
LAMBDAS = (0.1, 0.3, 0.5, 0.7, 0.9)
LABELS = {"softpull": "SoftPull", "ft": "FT", "apfl": "APFL", "ditto": "Ditto", "perfedavg": "Per-FedAvg",
          "pfedme": "pFedMe"}
SCORES = {"dice-super": "super model", "dice-personal": "own personalized model"}


def variants(table: int, lambdas: tuple[float, ...] = LAMBDAS,
             methods: tuple[str, ...] = PERSONALIZATIONS) -> dict[str, dict[str, object]]:
    """Label -> run-config overrides of each variant of ``table`` (6: ``methods``, 7: ``lambdas``)."""
    if table == 6:
        return {LABELS[name]: {"strategy": "fedsm", "personalization": name} for name in methods}
    if table == 7:
        return {f"lambda = {lam:g}": {"strategy": "fedsm", "personalization": "softpull", "softpull-lambda": lam}
                for lam in lambdas}
    raise ValueError(f"--table {table}: expected 6 (personalization methods) or 7 (SoftPull lambda)")


def read_test_scores(folder: Path, label: str, seed: int, settings: dict[str, object]) -> list[dict[str, object]]:
    """Long-format rows of a run's test Dice, one metric per score of :data:`SCORES`."""
    with (folder / "metrics.csv").open(newline="") as handle:
        metrics = list(csv.DictReader(handle))
    return [{"method": label, "seed": seed, "site": r["site"], "metric": r["metric"], "value": float(r["value"]),
             "config": json.dumps(settings, sort_keys=True)}
            for r in metrics if r["split"] == "test" and r["metric"] in SCORES]


def run_study(table: int, seeds: list[int], overrides: dict[str, object], out: Path,
              lambdas: tuple[float, ...] = LAMBDAS,
              methods: tuple[str, ...] = PERSONALIZATIONS) -> tuple[list[dict[str, object]], dict[str, float]]:
    """Every variant for every seed; returns the rows and the mean wall time per variant."""
    chosen = variants(table, lambdas, methods)
    for label, extra in chosen.items():
        try:
            RunConfig.from_mapping({**overrides, **extra})  # fail before any training
        except ValueError as error:
            raise ValueError(f"variant {label}: {error}") from None
    rows: list[dict[str, object]] = []
    walls: dict[str, list[float]] = {label: [] for label in chosen}
    jobs = [(seed, label, extra) for seed in seeds for label, extra in chosen.items()]
    for seed, label, extra in over_runs(jobs, f"personalization table {table}"):
        settings = {**overrides, **extra, "seed": seed}
        started = time.monotonic()
        slug = label.lower().replace(" ", "").replace("=", "")
        folder = launch_run(settings, out / "runs" / f"{slug}-seed{seed}", f"table {table} {label} seed {seed}")
        walls[label].append(time.monotonic() - started)
        rows += read_test_scores(folder, label, seed, settings)
        write_long_csv(out / "results.csv", rows)
        print(f"[study] {label} seed {seed}: {walls[label][-1]:.0f} s", flush=True)
    return rows, {label: sum(v) / len(v) for label, v in walls.items()}


def write_report(path: Path, table: int, rows: list[dict[str, object]], sites: list[str],
                 walls: dict[str, float], header: str) -> str:
    """``table.md``: one Markdown table per score, then the wall time of each variant."""
    parts = [header]
    text_rows = [{k: str(v) for k, v in row.items()} for row in rows]
    for metric, title in SCORES.items():
        parts += ["", f"Test Dice of the {title} ({metric}):", "", *comparison_table(text_rows, sites, metric)]
    parts += ["", "Wall time per run: " + ", ".join(f"{label} {wall:.0f} s" for label, wall in walls.items())]
    text = "\n".join(parts) + "\n"
    path.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=int, choices=(6, 7), required=True)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--lambdas", nargs="+", type=float, default=list(LAMBDAS), help="Table 7's SoftPull grid")
    parser.add_argument("--methods", nargs="+", default=list(PERSONALIZATIONS), choices=PERSONALIZATIONS,
                        help="Table 6's personalization methods")
    parser.add_argument("--run-config", default="", help='overrides, e.g. "num-server-rounds=10"')
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.run_config)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows, walls = run_study(args.table, args.seeds, overrides, args.out, tuple(args.lambdas), tuple(args.methods))
    config = RunConfig.from_mapping(overrides)
    sites = list(training_dataset(config.dataset, config.held_out_site).site_names)
    header = (f"Table {args.table}, seeds {args.seeds}, settings `{args.run_config}`, "
              f"total wall time {time.monotonic() - started:.0f} s")
    print(write_report(args.out / "table.md", args.table, rows, sites, walls, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
