r"""FedSM's super model under each rule for choosing gamma, re-scored from the ladder's FedSM checkpoints.

Usage (after the ladder trained the cells; the arguments name them as the ladder's do)::

    python -m experiments.ladder.gamma_rules --out experiments/results/ladder --rounds 100 \
        --run-config image-size=64 --datasets synthetic-fundus-style --seeds 0 1 2 \
        --variant input-norm --variant-config "input-norm='per-image'"

No training: each finished FedSM cell's last checkpoint is loaded, its
selector head fitted as in the run, and every site's validation and test
split scored at each gamma of the grid. Each rule chooses on validation only;
the test Dice it gets is then read off the test sweep (``per-model`` is
scored once more with its per-model gammas). To compare the rules without
reading test, each is also estimated by 2-fold cross-validation inside the
validation split (:func:`rescore`). Rules:

- ``validation``, ``client-average``, ``per-model``: the settings of
  ``gamma-selection`` (:func:`fedsm_core.algorithms.fedsm.gamma.select_gamma`);
- ``per-site``: each site takes the gamma best on its own validation split
  (what a hospital could choose for itself at deployment; not a setting);
- ``global`` (gamma 1) and ``selector`` (gamma 0), the two ends.

Rows go to ``<out>/gamma_rules.csv`` (a cell already there is skipped) and the
means over seeds to ``<out>/gamma_rules.md``.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from experiments import in_process
from experiments.ladder import run_folders
from experiments.ladder.loops import fedsm_federation, load_sites, read_cell_checkpoint
from experiments.ladder.run_ladder import cell_config, cell_folder
from experiments.runner import append_rows, parse_overrides, read_rows
from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID, choose_gamma, describe_gamma, select_gamma
from fedsm_core.data.arrays import SegArrays
from fedsm_core.data.repartition import repartition
from fedsm_core.device import select_device
from fedsm_core.evaluation.cross_fit import can_cross_fit, halve_by_case
from fedsm_core.evaluation.super_model_evaluation import evaluate_super_model

COLUMNS = ("dataset", "method", "seed", "split", "rule", "gamma", "site", "dice")
RULES = ("validation", "client-average", "per-model", "per-site", "global", "selector")
TEST, FOLDS = "test", "val-2fold"
Metrics = dict[str, dict[str, object]]


def sweep(federation: in_process.Federation, data: dict[str, SegArrays]) -> Metrics:
    """The super-model metrics of every site in ``data`` on its images, with the Dice at each gamma of the grid."""
    model = in_process.super_model(federation, 0.0)
    batch = federation.config.batch_size * 2
    return {site.name: evaluate_super_model(model, index, data[site.name], batch, federation.device,
                                            list(GAMMA_GRID), route_by=federation.config.route_by)
            for index, site in enumerate(federation.sites) if site.name in data}


def site_gammas(rule: str, validation: Metrics) -> dict[str, float] | tuple[float, ...]:
    """Each site's gamma under ``rule`` (a site of origin), or one gamma per personalized model (``per-model``)."""
    names = list(validation)
    if rule == "per-site":
        return {name: choose_gamma(validation[name]["dice-super-sweep"], GAMMA_GRID) for name in names}
    if rule in ("global", "selector"):
        return dict.fromkeys(names, 1.0 if rule == "global" else 0.0)
    chosen = select_gamma(rule, validation, 0.5)
    return chosen if isinstance(chosen, tuple) else dict.fromkeys(names, chosen)


def describe_rule(gammas: dict[str, float] | tuple[float, ...], names: list[str]) -> str:
    """A rule's gammas as one text: one value, one per personalized model, or one per site of origin."""
    if isinstance(gammas, tuple):
        return describe_gamma(gammas, names)
    values = [gammas[name] for name in names]
    return describe_gamma(values[0] if len(set(values)) == 1 else tuple(values), names)


def score_rules(federation: in_process.Federation, chosen_on: Metrics,
                scored_on: dict[str, SegArrays]) -> dict[str, tuple[str, dict[str, float]]]:
    """``rule -> (gamma chosen, site -> Dice)``: gamma from ``chosen_on``'s sweeps, Dice on ``scored_on``."""
    names, scored = list(chosen_on), sweep(federation, scored_on)
    results = {}
    for rule in RULES:
        gammas = site_gammas(rule, chosen_on)
        if isinstance(gammas, tuple):  # per-model: the route depends on the model, so score it again
            model = in_process.super_model(federation, gammas)
            batch = federation.config.batch_size * 2
            dice = {site.name: float(evaluate_super_model(model, index, scored_on[site.name], batch,
                                                          federation.device,
                                                          route_by=federation.config.route_by)["dice-super"])
                    for index, site in enumerate(federation.sites) if site.name in scored_on}
            results[rule] = (describe_rule(gammas, names), dice)
            continue
        dice = {name: scored[name]["dice-super-sweep"][GAMMA_GRID.index(gammas[name])] for name in names}
        results[rule] = (describe_rule(gammas, names), dice)
    return results


def rescore(federation: in_process.Federation) -> list[tuple[str, str, str, str, float]]:
    """``(split, rule, gamma, site, Dice)`` for every rule and site of the trained federation.

    ``test``: gamma chosen on the whole validation split, scored on test.
    ``val-2fold``: chosen on one half of every site's validation images,
    scored on the other, both ways round and averaged: an estimate of each
    rule that never reads the test split (sites whose validation split has no
    two non-empty halves, :func:`~fedsm_core.evaluation.cross_fit.can_cross_fit`,
    are left out of it).
    """
    sites = {site.name: site for site in federation.sites}
    validation = sweep(federation, {name: site.val for name, site in sites.items()})
    rows = [(TEST, rule, gamma, name, value)
            for rule, (gamma, dice) in score_rules(federation, validation,
                                                   {n: s.test for n, s in sites.items()}).items()
            for name, value in dice.items()]
    split = {name: halve_by_case(site.val) for name, site in sites.items() if can_cross_fit(site.val)}
    folds = []
    for first, second in ((0, 1), (1, 0)):
        chosen_on = sweep(federation, {name: parts[first] for name, parts in split.items()})
        folds.append(score_rules(federation, chosen_on, {name: parts[second] for name, parts in split.items()}))
    rows += [(FOLDS, rule, f"{gamma} / {folds[1][rule][0]}", name, (dice[name] + folds[1][rule][1][name]) / 2)
             for rule, (gamma, dice) in folds[0].items() for name in dice]
    return rows


def load_cell(dataset: str, method: str, seed: int, rounds: int, overrides: dict[str, object],
              folder: Path) -> in_process.Federation | None:
    """One ladder FedSM cell (``real`` rung) as trained, selector head fitted; None before it reaches ``rounds``."""
    state = read_cell_checkpoint(folder)
    if state is None or state["round"] < rounds:
        return None
    config = cell_config(dataset, seed, rounds, overrides, method)
    sites = load_sites(config)
    federation = fedsm_federation(config, repartition(sites, "real", config.data_seed),
                                   select_device(config.device))
    federation.fedsm, _ = state["federation"]
    in_process.fit_selector_head(federation)
    return federation


def seed_cells(values: list[float | None]) -> list[str]:
    """A table row's cells for one quantity: each seed's value, then their mean ("" where a seed has none)."""
    known = [v for v in values if v is not None]
    return [f"{v:.4f}" if v is not None else "" for v in values] + [f"{np.mean(known):.4f}" if known else ""]


def sections(groups: dict) -> list[tuple[str, dict, list[int]]]:
    """``(dataset, method) -> key -> seed -> ...`` as ``(title, that cell's mapping, its seeds)``, sorted."""
    return [(f"{dataset}, {method}", cells, sorted({seed for by_seed in cells.values() for seed in by_seed}))
            for (dataset, method), cells in sorted(groups.items())]


def section_head(title: str, seeds: list[int], quantities: tuple[str, ...], more: tuple[str, ...]) -> list[str]:
    """A table's heading and header rows: ``rule``, then each quantity by seed with its mean, then ``more``."""
    per_seed = " | ".join(f"seed {s}" for s in seeds)
    header = " | ".join(f"{quantity}: {per_seed} | mean" for quantity in quantities)
    return [f"## {title}", "", f"| rule | {header} | " + " | ".join(more) + " |",
            "|---|" + "---|" * (len(quantities) * (len(seeds) + 1) + len(more))]


def table(rows: list[dict[str, str]]) -> str:
    """Markdown: per (dataset, method) and rule, the client-average Dice by seed and the mean, for both splits."""
    groups: dict = collections.defaultdict(lambda: collections.defaultdict(dict))
    for row in rows:
        cell = groups[(row["dataset"], row["method"])][(row["split"], row["rule"])]
        cell.setdefault(int(row["seed"]), {"gamma": row["gamma"], "dice": []})["dice"].append(float(row["dice"]))
    lines = ["# FedSM's super model by rule for choosing gamma", "",
             "Generated by `python -m experiments.ladder.gamma_rules` from `gamma_rules.csv` (ladder checkpoints, "
             "no training). Client-average Dice of the super model. `2-fold validation`: gamma chosen on one half of "
             "each site's validation images, scored on the other, both ways round (never reads test); `test`: "
             "chosen on all validation images, scored on test.", ""]
    for title, cells, seeds in sections(groups):
        lines += section_head(title, seeds, ("2-fold validation", "test"), ("gamma chosen for test",))
        for rule in RULES:
            shown = []
            for split in (FOLDS, TEST):
                shown += seed_cells([float(np.mean(cells[(split, rule)][s]["dice"]))
                                     if s in cells.get((split, rule), {}) else None for s in seeds])
            gammas = "; ".join(cells[(TEST, rule)][s]["gamma"] for s in seeds if s in cells.get((TEST, rule), {}))
            lines.append(f"| {rule} | " + " | ".join(shown) + f" | {gammas} |")
        lines.append("")
    return "\n".join(lines)


def arguments(description: str, argv: list[str] | None,
              more: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The command line of a re-scoring script: the ladder's --out and the cells, named as the ladder names them.

    ``more(parser)``, when given, adds the script's own options.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="the ladder's --out (its runs/ hold the checkpoints)")
    parser.add_argument("--datasets", nargs="+", default=[], help="the ladder cells' datasets")
    parser.add_argument("--run-folders", nargs="+", type=Path, default=[],
                        help="finished FedSM run folders of the app (fine-tune-passes = 0) to re-score instead "
                             "of ladder cells (experiments.ladder.run_folders)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--run-config", default="")
    parser.add_argument("--variant", default="")
    parser.add_argument("--variant-config", default="")
    if more is not None:
        more(parser)
    args = parser.parse_args(argv)
    if not args.datasets and not args.run_folders:
        parser.error("name the cells to re-score: --datasets (ladder cells) or --run-folders (app runs)")
    return args


def rescore_cells(args: argparse.Namespace, name: str, columns: tuple[str, ...], score, make_table) -> int:
    """Score every finished FedSM cell not yet in ``<out>/<name>.csv`` with ``score(federation) -> rows``.

    Rows are appended per cell (an interrupted call resumes at the next cell)
    and ``make_table(rows) -> markdown`` rewrites ``<out>/<name>.md``.
    """
    csv_path = args.out / f"{name}.csv"
    if args.run_folders:
        run_folders.rescore_run_folders(args, name, columns, score)
        (args.out / f"{name}.md").write_text(make_table(read_rows(csv_path)))
        return 0
    overrides = {**parse_overrides(args.run_config), **parse_overrides(args.variant_config)}
    method = f"fedsm:{args.variant}" if args.variant else "fedsm"
    done = {(r["dataset"], r["method"], int(r["seed"])) for r in read_rows(csv_path)}
    for dataset in args.datasets:
        for seed in args.seeds:
            if (dataset, method, seed) in done:
                continue
            folder = cell_folder(args.out, (dataset, method, "real", seed))
            federation = load_cell(dataset, method, seed, args.rounds, overrides, folder)
            if federation is None:
                print(f"[{name}] {folder}: no checkpoint at round {args.rounds} yet; skipped", flush=True)
                continue
            append_rows(csv_path, columns, [(dataset, method, seed, *row) for row in score(federation)])
            print(f"[{name}] {dataset} {method} seed {seed}: re-scored", flush=True)
    (args.out / f"{name}.md").write_text(make_table(read_rows(csv_path)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Re-score the FedSM cells named like the ladder's that are finished and not yet in the CSV."""
    return rescore_cells(arguments(__doc__.split("\n\n")[0], argv), "gamma_rules", COLUMNS, rescore, table)


if __name__ == "__main__":
    sys.exit(main())
