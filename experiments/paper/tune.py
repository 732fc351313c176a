"""Choose each method's hyperparameters on validation data before the comparison.

Usage::

    python -m experiments.paper.tune --out results/tune --rounds 10 --seed 0
    python -m experiments.paper.compare --chosen results/tune/chosen.json ...

The sweep is sequential, so each choice builds on the previous one:

1. ``lr`` for the single-model methods, swept with FedAvg; the choice is used
   by every method but Scaffold (Centralized, Local, FedProx, FedBN, HarmoFL,
   kNN-Per, FedSM and FedSM-extra train with the same optimizer and step size).
2. ``proximal-mu`` for FedProx at the chosen ``lr``.
3. ``lr`` for Scaffold on its own, since the control-variate correction
   changes the useful step size.
4. ``softpull-lambda`` for FedSM (and FedSM-extra) at the chosen ``lr``.
5. ``amplitude-window`` for HarmoFL (0 normalizes every frequency; ``w``
   only those below ``w``). kNN-Per's mixing weight is already chosen on each
   site's validation split inside every run.
6. ``extra-rounds`` for FedSM-extra: the rounds that train its selector after
   the ``--rounds`` model rounds. Its candidates run in increasing order, each
   continuing the previous candidate's finished run from its checkpoint (a
   resumed run ends where an uninterrupted one ends), so the sweep trains the
   models once and the selector for the largest value only.

``--methods`` keeps only the steps whose choice some listed method uses (a
study of FedAvg, FedSM and HarmoFL skips the FedProx and Scaffold sweeps).
The sweep resumes: ``sweep.csv`` is written after every candidate, and a later
call with the same ``--run-config`` and ``--seed`` reads the candidates it holds
instead of rerunning them (another grid or more ``--methods`` only add
candidates); other settings are refused, naming ``tune.json``. The candidate an
interruption stopped continues from its last checkpoint
(:func:`experiments.runner.run_federated`).

``--steps extra-rounds --chosen <earlier>/chosen.json`` adds one step to an
earlier sweep: every method starts from the earlier choices, and the new
``chosen.json`` holds them with this sweep's choice added (the settings of the
methods it does not sweep stay exactly as they were).

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

from experiments.progress import over_runs
from experiments.runner import METHODS, ROOT, load_chosen, parse_overrides, run_federated, run_folders, run_settings
from experiments.study.runs import finished_checkpoint
from fedsm_core.config import RunConfig

DEFAULT_GRID = {
    "lr": [0.001, 0.002, 0.005],
    "proximal-mu": [0.001, 0.01, 0.1],
    "scaffold-lr": [0.0005, 0.001, 0.002],
    "softpull-lambda": [0.5, 0.7, 0.9],
    "amplitude-window": [0, 2, 8],
    "extra-rounds": [10, 20, 40],
}
INTEGER_KEYS = frozenset({"amplitude-window", "extra-rounds"})
# A larger value only adds rounds at the end of the run: its candidate continues the smaller one's.
GROWING_KEYS = frozenset({"extra-rounds"})
# (method swept, run-config key, grid name, methods that inherit the choice)
STEPS = (
    ("fedavg", "lr", "lr", ("centralized", "local", "fedavg", "fedprox", "fedbn", "harmofl", "knn-per", "fedsm",
                            "fedsm-extra", "fedsm-knn-per", "fedsm-softpull")),
    ("fedprox", "proximal-mu", "proximal-mu", ("fedprox",)),
    ("scaffold", "lr", "scaffold-lr", ("scaffold",)),
    ("fedsm", "softpull-lambda", "softpull-lambda", ("fedsm", "fedsm-extra", "fedsm-knn-per")),
    ("harmofl", "amplitude-window", "amplitude-window", ("harmofl",)),
    ("fedsm-extra", "extra-rounds", "extra-rounds", ("fedsm-extra",)),
)
SETTINGS_FILE = "tune.json"


def parse_grid(items: list[str]) -> dict[str, list[float]]:
    """``name=v1,v2,...`` items override :data:`DEFAULT_GRID` entries."""
    grid = {k: list(v) for k, v in DEFAULT_GRID.items()}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or name not in grid:
            raise ValueError(f"--grid item '{item}': expected one of {sorted(grid)} as name=v1,v2,...")
        try:
            grid[name] = [(int if name in INTEGER_KEYS else float)(v) for v in raw.split(",") if v]
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


def select_steps(methods: list[str] | None, names: list[str] | None = None,
                 ) -> tuple[tuple[str, str, str, tuple[str, ...]], ...]:
    """The steps of :data:`STEPS` whose choice one of ``methods`` uses (every step for ``None``).

    ``names`` (grid names, e.g. ``extra-rounds``) keeps only those steps.
    """
    unknown = sorted(set(methods or ()) - set(METHODS))
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; expected names from {list(METHODS)}")
    unknown = sorted(set(names or ()) - {step[2] for step in STEPS})
    if unknown:
        raise ValueError(f"--steps: unknown {unknown}; expected some of {[step[2] for step in STEPS]}")
    return tuple(step for step in STEPS if (methods is None or set(step[3]) & set(methods)) and
                 (names is None or step[2] in names))


def read_chosen(path: Path) -> dict[str, dict[str, object]]:
    """An earlier sweep's ``chosen.json``, validated: the methods it holds choices for."""
    return {method: settings for method, settings in load_chosen(path, {}).items() if settings}


def load_trials(out: Path, settings: dict[str, object]) -> list[dict]:
    """Candidates an earlier call with the same ``settings`` finished (``[]`` for a new folder)."""
    marker = out / SETTINGS_FILE
    text = json.dumps(settings, indent=2, sort_keys=True, default=str) + "\n"
    if not marker.is_file():
        marker.write_text(text)
        return []
    if marker.read_text() != text:
        raise ValueError(f"{marker}: this folder holds a sweep with other settings ({marker.read_text().strip()}); "
                         f"use another --out, or delete the folder to start over")
    if not (out / "sweep.csv").is_file():
        return []
    with (out / "sweep.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [{"method": r["method"], "key": r["key"], "value": _number(r["key"], r["value"]),
             "val-dice": float(r["val-dice"]), "seconds": float(r["seconds"]), "config": r.get("config") or ""}
            for r in rows]


def _number(key: str, text: str) -> float | int:
    return int(float(text)) if key in INTEGER_KEYS else float(text)


def sweep(base: dict[str, object], grid: dict[str, list[float]], seed: int, out: Path,
          steps=STEPS, done: list[dict] | None = None, earlier: dict[str, dict] | None = None,
          ) -> tuple[dict, list[dict]]:
    """Run ``steps`` in order; return chosen overrides per method and every trial.

    ``earlier`` (an earlier sweep's choices per method) is where each method
    starts; the choices returned are ``earlier``'s with this sweep's added.

    A candidate found in ``done`` (same method and the same complete run config)
    is read, not rerun; ``sweep.csv`` is rewritten after every new candidate.
    The trials returned (and written) end with the candidates of ``done`` that
    this grid did not reach, so an interrupted or narrower sweep loses none.
    """
    chosen: dict[str, dict[str, object]] = {}
    trials: list[dict] = []
    finished = {(t["method"], t["config"]): t for t in done or []}
    for method, key, grid_name, heirs in steps:
        settings = {**base, **(earlier or {}).get(method, {}), **chosen.get(method, {})}
        scores: dict[float, float] = {}
        values = sorted(grid[grid_name]) if key in GROWING_KEYS else grid[grid_name]
        for index, value in enumerate(over_runs(values, f"tune {method} {key}")):
            config = trial_config(settings, key, value)
            trial = finished.get((method, config))
            if trial is None:
                start = _grown_from(method, key, values[:index], settings, seed, out) if key in GROWING_KEYS else None
                trial = {**_run_trial(method, key, value, settings, seed, out, start), "config": config}
            trials.append(trial)
            write_trials(out, with_unreached(trials, done or []))
            scores[value] = trial["val-dice"]
            print(f"[tune] {method} {key}={value}: pooled val Dice {scores[value]:.4f}", flush=True)
        best = choose(scores)
        for heir in heirs:
            chosen.setdefault(heir, {})[key] = best
        print(f"[tune] {method}: chose {key}={best}", flush=True)
    merged = {m: {**(earlier or {}).get(m, {}), **chosen.get(m, {})} for m in {*(earlier or {}), *chosen}}
    return merged, with_unreached(trials, done or [])


def with_unreached(trials: list[dict], done: list[dict]) -> list[dict]:
    """``trials`` followed by the finished candidates of ``done`` that are not among them, in their order."""
    reached = {(t["method"], t["config"]) for t in trials}
    return trials + [t for t in done if (t["method"], t["config"]) not in reached]


def trial_config(settings: dict[str, object], key: str, value: float) -> str:
    """A candidate's identity: its complete run config, every default filled in (JSON)."""
    return json.dumps(RunConfig.from_mapping({**settings, key: value}).to_mapping(), sort_keys=True, default=str)


def _run_trial(method: str, key: str, value: float, settings: dict[str, object], seed: int, out: Path,
               start: Path | None = None) -> dict:
    started = time.monotonic()
    _, curve = run_federated(method, seed, {**settings, key: value}, _trial_folder(out, method, key, value),
                             start=start)
    return {"method": method, "key": key, "value": value, "val-dice": validation_score(curve),
            "seconds": round(time.monotonic() - started, 1)}


def _trial_folder(out: Path, method: str, key: str, value: float) -> Path:
    return out / f"{method}-{key}-{value}"


def _grown_from(method: str, key: str, smaller: list[float], settings: dict[str, object], seed: int,
                out: Path) -> Path | None:
    """The checkpoint of the largest smaller candidate's finished run, if its run folder is still there."""
    for value in reversed(smaller):
        found = finished_checkpoint(run_folders(_trial_folder(out, method, key, value), method, seed),
                                    run_settings(method, seed, {**settings, key: value}))
        if found is not None:
            return found
    return None


def write_trials(out: Path, trials: list[dict]) -> None:
    """``sweep.csv``: every candidate so far and its score."""
    with (out / "sweep.csv").open("w", newline="") as handle:
        # config: the candidate's complete run config (its identity when a sweep resumes)
        writer = csv.DictWriter(handle, fieldnames=["method", "key", "value", "val-dice", "seconds", "config"],
                                restval="")
        writer.writeheader()
        writer.writerows(trials)


def write_outputs(out: Path, chosen: dict, trials: list[dict], header: str) -> None:
    """``chosen.json``, ``sweep.csv`` and a Markdown summary."""
    (out / "chosen.json").write_text(json.dumps(chosen, indent=2, sort_keys=True) + "\n")
    write_trials(out, trials)
    lines = [header, "", "| method | key | value | pooled val Dice | chosen |", "|---|---|---|---|---|"]
    for t in trials:
        mark = "yes" if chosen.get(t["method"], {}).get(t["key"]) == t["value"] else ""
        lines.append(f"| {t['method']} | {t['key']} | {t['value']:g} | {t['val-dice']:.4f} | {mark} |")
    (out / "sweep.md").write_text("\n".join(lines) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "tune")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=10, help="rounds per candidate run")
    parser.add_argument("--run-config", default="", help="overrides for every run, e.g. \"image-size=64\"")
    parser.add_argument("--grid", nargs="*", default=[], help="e.g. lr=0.001,0.002 softpull-lambda=0.5,0.9")
    parser.add_argument("--methods", nargs="*", default=None,
                        help="sweep only what these methods use, e.g. fedavg fedsm harmofl (default: every step)")
    parser.add_argument("--steps", nargs="*", default=None,
                        help=f"sweep only these steps, by grid name: {[step[2] for step in STEPS]}")
    parser.add_argument("--chosen", type=Path, default=None,
                        help="an earlier sweep's chosen.json: each method starts from its choices, and this "
                             "sweep's chosen.json holds them with this sweep's added")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    args = parse_args(argv)
    grid = parse_grid(args.grid)
    steps = select_steps(args.methods, args.steps)
    earlier = read_chosen(args.chosen) if args.chosen else {}
    base = {**parse_overrides(args.run_config), "num-server-rounds": args.rounds}
    base.setdefault("eval-every", args.rounds)  # only the last round's validation score is used
    RunConfig.from_mapping(base)  # fail before any training on a bad key or value
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # Another grid or more --methods may reuse the folder: a candidate is found by its complete run config.
    settings = {"run-config": base, "seed": args.seed, **({"chosen": earlier} if earlier else {})}
    done = load_trials(args.out, settings)
    chosen, trials = sweep(base, grid, args.seed, args.out, steps, done, earlier)
    header = (f"Validation sweep, seed {args.seed}, {args.rounds} rounds per run, settings `{args.run_config}`"
              f"{f', starting from `{args.chosen}`' if args.chosen else ''}; "
              f"wall time {time.monotonic() - started:.0f} s")
    write_outputs(args.out, chosen, trials, header)
    print(json.dumps(chosen, indent=2, sort_keys=True))
    print(f"[tune] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
