"""Choose each method's hyperparameters on validation data before the comparison.

Usage::

    python -m experiments.tune --out results/tune --rounds 10 --seed 0
    python -m experiments.compare --chosen results/tune/chosen.json ...

The sweep is sequential, so each choice builds on the previous one:

1. ``lr`` for the single-model methods, swept with FedAvg; the choice is used
   by every method (Centralized, Local, FedProx, FedSM and FedSM-extra train
   with the same optimizer and the same step size).
2. ``proximal-mu`` for FedProx at the chosen ``lr``.
3. ``lr`` for Scaffold on its own, since the control-variate correction
   changes the useful step size.
4. ``softpull-lambda`` for FedSM (and FedSM-extra) at the chosen ``lr``.

Each candidate is one ``flwr run`` of ``--rounds`` rounds on one seed, scored
by the pooled validation Dice of the model the method deploys after the last
round (the super model for FedSM, the global model otherwise). Test data is
never read. gamma is chosen inside every FedSM run, on validation data, after
its last round.

Writes ``sweep.csv`` (every candidate and its score), ``chosen.json`` (per
method: the overrides ``compare --chosen`` applies) and ``sweep.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from experiments.compare import ROOT, parse_overrides, run_federated
from experiments.progress import over_runs
from fedsm_core.config import RunConfig

DEFAULT_GRID = {
    "lr": [0.001, 0.002, 0.005],
    "proximal-mu": [0.001, 0.01, 0.1],
    "scaffold-lr": [0.0005, 0.001, 0.002],
    "softpull-lambda": [0.5, 0.7, 0.9],
}
# (method swept, run-config key, grid name, methods that inherit the choice)
STEPS = (
    ("fedavg", "lr", "lr", ("centralized", "local", "fedavg", "fedprox", "fedsm", "fedsm-extra")),
    ("fedprox", "proximal-mu", "proximal-mu", ("fedprox",)),
    ("scaffold", "lr", "scaffold-lr", ("scaffold",)),
    ("fedsm", "softpull-lambda", "softpull-lambda", ("fedsm", "fedsm-extra")),
)


def parse_grid(items: list[str]) -> dict[str, list[float]]:
    """``name=v1,v2,...`` items override :data:`DEFAULT_GRID` entries."""
    grid = {k: list(v) for k, v in DEFAULT_GRID.items()}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or name not in grid:
            raise ValueError(f"--grid item '{item}': expected one of {sorted(grid)} as name=v1,v2,...")
        try:
            grid[name] = [float(v) for v in raw.split(",") if v]
        except ValueError as error:
            raise ValueError(f"--grid item '{item}': values must be numbers ({error})") from None
        if not grid[name]:
            raise ValueError(f"--grid item '{item}' has no values")
    return grid


def validation_score(curve: list[tuple[int, float]]) -> float:
    """Pooled validation Dice after the last evaluated round."""
    if not curve:
        raise RuntimeError("the run reported no pooled validation Dice; check eval-every and the run log")
    return max(curve)[1]


def choose(scores: dict[float, float]) -> float:
    """The candidate with the highest score; ties go to the smaller value."""
    return min(scores, key=lambda value: (-scores[value], value))


def sweep(base: dict[str, object], grid: dict[str, list[float]], seed: int, out: Path) -> tuple[dict, list[dict]]:
    """Run the steps of :data:`STEPS`; return chosen overrides per method and every trial."""
    chosen: dict[str, dict[str, object]] = {}
    trials: list[dict] = []
    for method, key, grid_name, heirs in STEPS:
        settings = {**base, **chosen.get(method, {})}
        scores: dict[float, float] = {}
        for value in over_runs(grid[grid_name], f"tune {method} {key}"):
            started = time.monotonic()
            _, curve = run_federated(method, seed, {**settings, key: value}, out / f"{method}-{key}-{value}")
            scores[value] = validation_score(curve)
            trials.append({"method": method, "key": key, "value": value, "val-dice": scores[value],
                           "seconds": round(time.monotonic() - started, 1)})
            print(f"[tune] {method} {key}={value}: pooled val Dice {scores[value]:.4f}", flush=True)
        best = choose(scores)
        for heir in heirs:
            chosen.setdefault(heir, {})[key] = best
        print(f"[tune] {method}: chose {key}={best}", flush=True)
    return chosen, trials


def write_outputs(out: Path, chosen: dict, trials: list[dict], header: str) -> None:
    """``chosen.json``, ``sweep.csv`` and a Markdown summary."""
    (out / "chosen.json").write_text(json.dumps(chosen, indent=2, sort_keys=True) + "\n")
    with (out / "sweep.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["method", "key", "value", "val-dice", "seconds"])
        writer.writeheader()
        writer.writerows(trials)
    lines = [header, "", "| method | key | value | pooled val Dice | chosen |", "|---|---|---|---|---|"]
    for t in trials:
        mark = "yes" if chosen.get(t["method"], {}).get(t["key"]) == t["value"] else ""
        lines.append(f"| {t['method']} | {t['key']} | {t['value']:g} | {t['val-dice']:.4f} | {mark} |")
    (out / "sweep.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "tune")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=10, help="rounds per candidate run")
    parser.add_argument("--run-config", default="", help="overrides for every run, e.g. \"image-size=64\"")
    parser.add_argument("--grid", nargs="*", default=[], help="e.g. lr=0.001,0.002 softpull-lambda=0.5,0.9")
    args = parser.parse_args(argv)
    grid = parse_grid(args.grid)
    base = {**parse_overrides(args.run_config), "num-server-rounds": args.rounds}
    base.setdefault("eval-every", args.rounds)  # only the last round's validation score is used
    RunConfig.from_mapping(base)  # fail before any training on a bad key or value
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    chosen, trials = sweep(base, grid, args.seed, args.out)
    header = (f"Validation sweep, seed {args.seed}, {args.rounds} rounds per run, settings `{args.run_config}`; "
              f"wall time {time.monotonic() - started:.0f} s")
    write_outputs(args.out, chosen, trials, header)
    print(json.dumps(chosen, indent=2, sort_keys=True))
    print(f"[tune] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
