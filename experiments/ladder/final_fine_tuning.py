r"""FedSM with finally fine-tuned personalized models, re-scored from the ladder's FedSM checkpoints.

Usage (after the ladder trained the cells; the arguments name them as the ladder's do)::

    python -m experiments.ladder.final_fine_tuning --out experiments/results/ladder --rounds 100 \
        --run-config image-size=64 --datasets synthetic-fundus --seeds 0 1 2 \
        --variant input-norm --variant-config "input-norm='per-image'" --max-passes 20

Each finished FedSM cell's last checkpoint is loaded; every site then
fine-tunes the final global model on its training split for up to
``--max-passes`` passes and keeps the pass best on its validation split
(:func:`~fedsm_core.algorithms.fedsm.final_fine_tuning.fine_tune_on_validation`).
The super model is scored on test twice, with the SoftPull personalized models
it was trained with and with the fine-tuned ones in their place (same global
model and selector), gamma chosen on validation by each rule of
:mod:`experiments.ladder.gamma_rules`; rule ``own`` is each site's own
personalized model alone, ``global`` the global model alone (gamma 1). Rows
go to ``<out>/final_fine_tuning.csv`` (a cell already there is skipped), the
means over seeds to ``final_fine_tuning.md``. ``--run-folders`` re-scores
finished app runs instead of ladder cells (:mod:`experiments.ladder.run_folders`).

``--on-validation`` answers the question the default of ``fine-tune-passes``
asks without reading the test split: every site's validation images are
halved (even- and odd-numbered cases,
:func:`~fedsm_core.evaluation.cross_fit.halve_by_case`); each site fine-tunes with
its pass chosen on one half, gamma is chosen on that half for both arms, and both super models
are scored on the other half, both ways round. Rows (one per site and fold)
go to ``final_fine_tuning_validation.csv``, the table to
``final_fine_tuning_validation.md``. Sites whose validation split has no
two non-empty halves (one case) are left out of it.
"""

from __future__ import annotations

import collections
import functools
import sys

import numpy as np

from experiments import in_process
from experiments.ladder import gamma_rules
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.cross_fit import can_cross_fit, halve_by_case
from fedsm_core.evaluation.super_model_evaluation import evaluate_model

COLUMNS = ("dataset", "method", "seed", "models", "rule", "gamma", "site", "dice", "passes")
FOLD_COLUMNS = (*COLUMNS, "fold")
RULES = ("own", "validation", "client-average", "per-model", "per-site", "global")  # global: gamma 1, the bar
MODELS = ("softpull", "fine-tuned")


def score_models(federation: in_process.Federation, models: str, passes: dict[str, int],
                 choose: dict[str, SegArrays] | None = None, score: dict[str, SegArrays] | None = None,
                 ) -> list[tuple]:
    """``(models, rule, gamma, site, Dice, passes)`` of the federation's current personalized models.

    Gamma is chosen on ``choose`` (default: every site's validation split),
    Dice measured on ``score`` (default: every site's test split).
    """
    sites = {site.name: site for site in federation.sites}
    choose = choose if choose is not None else {name: site.val for name, site in sites.items()}
    score = score if score is not None else {name: site.test for name, site in sites.items()}
    rows = []
    for name, data in score.items():
        model = federation.spec.load_segmentation(federation.fedsm.personalized[name], name)
        dice = evaluate_model(model, data, federation.config.batch_size * 2, federation.device)["dice-global"]
        rows.append((models, "own", "", name, float(dice), passes.get(name, "")))
    validation = gamma_rules.sweep(federation, choose)
    scored = gamma_rules.score_rules(federation, validation, score)
    for rule, (gamma, dice) in scored.items():
        if rule in RULES:
            rows += [(models, rule, gamma, name, value, passes.get(name, "")) for name, value in dice.items()]
    return rows


def fine_tune_sites(federation: in_process.Federation, max_passes: int,
                    validation: dict[str, SegArrays] | None = None) -> dict[str, int]:
    """Replace every site's personalized model by the fine-tuned global model; returns the passes each kept."""
    tuned = in_process.fine_tune(federation, max_passes, validation)
    for name, result in tuned.items():
        print(f"[final-fine-tuning]   {name}: pass {result.passes} of {max_passes}, validation Dice "
              f"{result.curve[0]:.4f} -> {result.validation_dice:.4f}", flush=True)
    return {name: result.passes for name, result in tuned.items()}


def scorer(max_passes: int):
    """``score(federation) -> rows`` for :func:`~experiments.ladder.gamma_rules.rescore_cells`."""

    def score(federation: in_process.Federation) -> list[tuple]:
        rows = score_models(federation, "softpull", {})
        passes = fine_tune_sites(federation, max_passes)
        rows += score_models(federation, "fine-tuned", passes)
        for models in MODELS:
            mean = np.mean([r[4] for r in rows if r[0] == models and r[1] == "client-average"])
            print(f"[final-fine-tuning]   {models}: client-average test Dice {mean:.4f}", flush=True)
        return rows

    return score


def fold_scorer(max_passes: int):
    """``score(federation) -> rows`` of ``--on-validation``: chosen on one validation half, scored on the other."""

    def score(federation: in_process.Federation) -> list[tuple]:
        softpull = dict(federation.fedsm.personalized)
        halves = {site.name: halve_by_case(site.val) for site in federation.sites if can_cross_fit(site.val)}
        rows = []
        for fold, (first, second) in enumerate(((0, 1), (1, 0)), start=1):
            choose = {name: parts[first] for name, parts in halves.items()}
            scored_on = {name: parts[second] for name, parts in halves.items()}
            federation.fedsm.personalized.update(softpull)
            rows += [(*row, fold) for row in score_models(federation, "softpull", {}, choose, scored_on)]
            passes = fine_tune_sites(federation, max_passes, choose)
            rows += [(*row, fold) for row in score_models(federation, "fine-tuned", passes, choose, scored_on)]
        federation.fedsm.personalized.update(softpull)
        for models in MODELS:
            mean = np.mean([r[4] for r in rows if r[0] == models and r[1] == "client-average"])
            print(f"[final-fine-tuning]   {models}: client-average held-out validation Dice {mean:.4f}", flush=True)
        return rows

    return score


def table(rows: list[dict[str, str]], on_validation: bool = False) -> str:
    """Markdown: per (dataset, method) and rule, client-average Dice with SoftPull and fine-tuned models.

    ``on_validation``: the rows of ``--on-validation`` (held-out validation
    halves, each site and fold one row) instead of test.
    """
    groups: dict = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    for row in rows:
        groups[(row["dataset"], row["method"])][(row["models"], row["rule"])][int(row["seed"])].append(row)
    lines = ["# FedSM with finally fine-tuned personalized models", "",
             "Generated by `python -m experiments.ladder.final_fine_tuning` from `final_fine_tuning.csv` (ladder "
             "checkpoints or app run folders). Client-average test Dice of the super model with the personalized "
             "models SoftPull trained and with each site's fine-tuned global model in their place (pass chosen on "
             "the site's validation split); gamma by each rule of `gamma_rules.md`; `own`: each site's "
             "personalized model alone; `global`: the global model alone (gamma 1).", ""]
    if on_validation:
        lines[2] = ("Generated by `python -m experiments.ladder.final_fine_tuning --on-validation` from "
                    "`final_fine_tuning_validation.csv` (ladder checkpoints or app run folders); the test split is "
                    "not read. Each site's validation images are halved (by case where the images are slices of "
                    "cases); the fine-tuning pass and gamma are chosen on one half, the super model with SoftPull's "
                    "and with the fine-tuned personalized models is scored on the other, both ways round: mean "
                    "client-average Dice over the two folds; `passes kept`: over sites and folds.")
    for title, cells, seeds in gamma_rules.sections(groups):
        lines += gamma_rules.section_head(title, seeds, MODELS, ("change", "passes kept"))
        for rule in RULES:
            if not any(cells[(m, rule)] for m in MODELS):  # rows written before the rule was scored
                continue
            means = {m: [np.mean([float(r["dice"]) for r in cells[(m, rule)][s]]) if s in cells[(m, rule)] else None
                         for s in seeds] for m in MODELS}
            pairs = [(a, b) for a, b in zip(means["softpull"], means["fine-tuned"], strict=True)
                     if a is not None and b is not None]
            change = f"{100 * np.mean([b - a for a, b in pairs]):+.2f} pt" if pairs else ""
            kept = sorted({int(r["passes"]) for s in seeds for r in cells[("fine-tuned", rule)].get(s, [])})
            shown = gamma_rules.seed_cells(means["softpull"]) + gamma_rules.seed_cells(means["fine-tuned"])
            lines.append(f"| {rule} | " + " | ".join(shown)
                         + f" | {change} | {', '.join(map(str, kept))} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Re-score the finished FedSM cells not yet in ``final_fine_tuning.csv``."""
    args = gamma_rules.arguments(__doc__.split("\n\n")[0], argv, add_options)
    if args.on_validation:
        return gamma_rules.rescore_cells(args, "final_fine_tuning_validation", FOLD_COLUMNS,
                                         fold_scorer(args.max_passes), functools.partial(table, on_validation=True))
    return gamma_rules.rescore_cells(args, "final_fine_tuning", COLUMNS, scorer(args.max_passes), table)


def add_options(parser) -> None:
    """Add the re-scorer's own options to the ladder's cell arguments."""
    parser.add_argument("--max-passes", type=int, default=20,
                        help="most passes each site fine-tunes the global model for")
    parser.add_argument("--on-validation", action="store_true",
                        help="score both arms on held-out validation halves (never reading test) instead of test")


if __name__ == "__main__":
    sys.exit(main())
