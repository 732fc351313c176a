r"""How soon FedSM's final fine-tuning gets within one point of pooled training: R rounds, then P passes.

Usage (resumable; the study's ``results.csv`` gives centralized training's curve of the same seeds)::

    python -m experiments.ladder.fine_tuning_speed --out experiments/results/fine-tuning-speed \
        --dataset synthetic-fundus-style --seeds 0 1 2 --stops 10 20 30 40 50 --max-passes 30 \
        --run-config "image-size=64 aggregation='mean'" \
        --study-csv experiments/results/reference-defaults/results.csv

The reference study's speed target asks for one point below centralized
training's best pooled validation Dice in at most twice the passes
centralized training needs. FedSM's final fine-tuning (``fine-tune-passes``)
is what lifts it there, after its last round, and its passes count
(:mod:`experiments.study.speed_table`). This asks which stop and which
fine-tuning length get there soonest. The global model trains as FedSM's
does (FedAvg rounds of the ladder's loop, :func:`~experiments.ladder.loops.fedavg_round`);
after each round R of ``--stops`` every site fine-tunes a copy for
``--max-passes`` passes as the app's final fine-tuning does (its request's
round R + 1, the base ``lr``; :func:`~fedsm_core.algorithms.fedsm.final_fine_tuning.fine_tune_on_splits`)
and its validation Dice after every pass is recorded. A fine-tuning of P
passes keeps each site's best pass up to P, as ``fine-tune-passes = P``
would; the pooled validation Dice weights each site's by its validation
images with foreground. Its cost is R + P passes. Validation only, and the
same split chooses each site's pass, as in the app: the numbers flatter the
models a little, as the study's last validation point does.

Writes ``<out>/curves.csv`` (dataset, seed, rounds, site, pass, dice,
images) and ``<out>/table.md``; the global model after each stop goes to
``<out>/runs/`` (ignored by git), so an interrupted seed continues from its
last stop and a finished stop is not fine-tuned again.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from experiments.ladder.loops import fedavg_round, load_sites, read_cell_checkpoint, round_state, save_cell_checkpoint
from experiments.runner import append_rows, parse_overrides, read_rows
from experiments.study.speed_table import CENTRALIZED, MARGIN, rounds_to, validation_curves
from fedsm_core.algorithms.fedsm.final_fine_tuning import fine_tune_on_splits
from fedsm_core.algorithms.server_optimizer import ServerOptimizer
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.registry import dataset_label
from fedsm_core.device import select_device, set_cpu_threads
from fedsm_core.models.weights import get_weights

COLUMNS = ("dataset", "seed", "rounds", "site", "pass", "dice", "images")
Curves = dict[int, dict[str, tuple[int, list[float]]]]  # rounds -> site -> (images, Dice after pass 0..E)


def foreground_images(site: SiteSplits) -> int:
    """Validation images with foreground: the images a site's mean validation Dice is taken over."""
    masks = site.val.masks.reshape(len(site.val), -1)
    return int((masks.sum(axis=1) > 0).sum())


def fine_tuning_rows(config: RunConfig, sites: list[SiteSplits], weights, rounds: int, max_passes: int,
                     device: torch.device) -> list[tuple]:
    """Every site fine-tunes the global model after ``rounds`` rounds: one row per site and pass (pass 0: none)."""
    spec = config.model_spec(sites[0].train.masks.shape[1], len(sites))
    rows = []
    for index, site in enumerate(sites):
        settings = dataclasses.replace(config.round_settings(rounds + 1, index), lr=config.lr)  # as the app's request
        curve = fine_tune_on_splits(spec, weights, site.train, [site.val], max_passes, settings, device)[0].curve
        rows += [(dataset_label(config.dataset), config.seed, rounds, site.name, done, dice, foreground_images(site))
                 for done, dice in enumerate(curve)]
    return rows


def run_seed(config: RunConfig, stops: Sequence[int], max_passes: int, out: Path, finished: set[int]) -> None:
    """Train the global model to the last stop, fine-tuning at each stop not in ``finished``."""
    set_cpu_threads(config.torch_threads)
    sites, device = load_sites(config), select_device(config.device)
    spec = config.model_spec(sites[0].train.masks.shape[1], len(sites))
    folder = out / "runs" / f"{dataset_label(config.dataset)}-seed{config.seed}"
    state = read_cell_checkpoint(folder)
    if state is None:
        torch.manual_seed(config.seed)  # the app's initial model (server_app.strategies.builder)
        state = {"round": 0, "weights": get_weights(spec.build_segmentation()), **round_state(spec)}
    optimizer = ServerOptimizer(config.server_settings, config.aggregation_settings)
    optimizer.load_state_dict(state["server-optimizer"])
    while state["round"] < max(stops):
        server_round = state["round"] + 1
        state["weights"] = fedavg_round(state["weights"], sites, spec, config, server_round, device, optimizer, state)
        state["round"], state["server-optimizer"] = server_round, optimizer.state_dict()
        if server_round in stops:
            if server_round not in finished:
                print(f"[speed] {config.dataset} seed {config.seed}: fine-tuning after round {server_round}",
                      flush=True)
                rows = fine_tuning_rows(config, sites, state["weights"], server_round, max_passes, device)
                append_rows(out / "curves.csv", COLUMNS, rows)
            save_cell_checkpoint(folder, state)


def read_curves(rows: Sequence[Mapping[str, str]], dataset: str, seed: str) -> Curves:
    """The recorded fine-tuning curves of one dataset and seed."""
    curves: Curves = defaultdict(dict)
    for row in rows:
        if row["dataset"] == dataset and row["seed"] == seed:
            images, curve = curves[int(row["rounds"])].get(row["site"], (int(row["images"]), []))
            curve.append(float(row["dice"]))
            curves[int(row["rounds"])][row["site"]] = (images, curve)
    return curves


def pooled_after(sites: Mapping[str, tuple[int, list[float]]], passes: int) -> float:
    """Pooled validation Dice when each site keeps its best pass up to ``passes`` (pass 0: the global model)."""
    total = sum(images for images, _ in sites.values())
    return sum(images * max(curve[:passes + 1]) for images, curve in sites.values()) / total


def soonest(curves: Curves, target: float) -> tuple[int, int, float] | None:
    """``(rounds, passes, Dice)`` of the cheapest R + P whose pooled validation Dice reaches ``target``."""
    reached = [(rounds + passes, rounds, passes, pooled_after(sites, passes))
               for rounds, sites in curves.items() for passes in range(len(next(iter(sites.values()))[1]))
               if pooled_after(sites, passes) >= target]
    return min(reached)[1:] if reached else None


def seed_lines(curves: Curves, centralized: Sequence[tuple[int, float]], label: str, steps: Sequence[int]) -> list[str]:
    """One seed's table: pooled validation Dice per stop and fine-tuning length, and the soonest that reaches it."""
    target = max(dice for _, dice in centralized) - MARGIN
    reached = rounds_to(centralized, target)
    lines = [f"### {label}", "", f"Target {target:.4f} (centralized's best {target + MARGIN:.4f} minus {MARGIN:g}), "
             f"reached by centralized training after {reached} passes; `*`: reached.", "",
             "| rounds | " + " | ".join(f"+{p} passes" for p in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for rounds, sites in sorted(curves.items()):
        cells = [f"{pooled_after(sites, p):.4f}{'*' if pooled_after(sites, p) >= target else ''}" for p in steps]
        lines.append(f"| {rounds} | " + " | ".join(cells) + " |")
    found = soonest(curves, target)
    lines += ["", "Soonest: never within the stops and passes measured." if found is None else
              f"Soonest: {found[0]} rounds + {found[1]} passes = {sum(found[:2])} passes "
              f"({sum(found[:2]) / reached:.2f} times centralized's {reached}; pooled validation Dice {found[2]:.4f})."]
    return lines


def table(rows: Sequence[Mapping[str, str]], study_rows: Sequence[Mapping[str, str]], steps: Sequence[int]) -> str:
    """``table.md``: a section per dataset and seed that centralized training of the study has finished."""
    text = ["Pooled validation Dice of every site's own fine-tuned model after R rounds of the global model and up to "
            "P fine-tuning passes (each site keeps its best pass up to P). The commands that wrote it: `commands.md` "
            "beside it.", ""]
    for dataset in dict.fromkeys(row["dataset"] for row in rows):
        centralized = validation_curves(study_rows, dataset).get(CENTRALIZED, {})
        for seed in sorted({row["seed"] for row in rows if row["dataset"] == dataset}, key=int):
            if seed in centralized:
                text += [*seed_lines(read_curves(rows, dataset, seed), centralized[seed], f"{dataset}, seed {seed}",
                                     steps), ""]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where curves.csv, table.md and runs/ go")
    parser.add_argument("--dataset", required=True, help="a dataset name or federation file, as in the study")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="each sets seed and data-seed")
    parser.add_argument("--stops", type=int, nargs="+", required=True, help="rounds after which the sites fine-tune")
    parser.add_argument("--max-passes", type=int, default=30, help="passes of each fine-tuning")
    parser.add_argument("--run-config", default="", help="'key=value ...' over pyproject.toml's defaults")
    parser.add_argument("--study-csv", type=Path, required=True, help="a study's results.csv with centralized runs")
    args = parser.parse_args(argv)
    if not args.study_csv.is_file():
        raise SystemExit(f"--study-csv {args.study_csv}: no such file; give a study's results.csv")
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        config = RunConfig.from_mapping({**parse_overrides(args.run_config), "strategy": "fedavg",
                                         "dataset": args.dataset, "seed": seed, "data-seed": seed,
                                         "num-server-rounds": max(args.stops)})
        finished = {int(r["rounds"]) for r in read_rows(args.out / "curves.csv")
                    if r["dataset"] == dataset_label(config.dataset) and r["seed"] == str(seed)}
        run_seed(config, sorted(set(args.stops)), args.max_passes, args.out, finished)
    steps = sorted({0, *range(5, args.max_passes + 1, 5), args.max_passes})
    (args.out / "table.md").write_text(table(read_rows(args.out / "curves.csv"), read_rows(args.study_csv), steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
