r"""FedSM's gamma chosen on cross-fitted validation Dice of its fine-tuned personalized models.

Usage (finished FedSM app runs with ``fine-tune-passes = 0``, such as the study's ``fedsm-softpull``
cells, or the ladder's FedSM cells named as its re-scorers name them)::

    python -m experiments.ladder.cross_fit_gamma --out experiments/results/reference-defaults \
        --run-folders <run folder> --max-passes 30

A run with ``fine-tune-passes`` > 0 picks each site's fine-tuning pass on its
validation split and then chooses gamma on the same images, which flatters
the models it picked; ``fine-tune-gamma = "cross-fit"`` scores each site's
own images of one validation half with the pass best on the other half for
the gamma choice (:mod:`fedsm_core.evaluation.cross_fit`). This re-scorer
compares both on the same trained federation: every site fine-tunes the
final global model once, its pass chosen on the whole split and on each half.

Arms, rows of ``<out>/cross_fit_gamma.csv`` (split ``test``: Dice on test at
the gamma chosen; ``val``: the Dice that rule expected on the sweeps it chose
on, none for ``per-model``):

- ``softpull``: SoftPull's personalized models, gamma on validation;
- ``fine-tuned``: the fine-tuned models, gamma on the validation split that
  chose their passes (a run with ``fine-tune-gamma = "validation"``);
- ``cross-fit``: the same models, gamma on the cross-fitted sweeps (a run
  with ``fine-tune-gamma = "cross-fit"``, the default).

The table (``cross_fit_gamma.md``) gives client averages, the mean over seeds.
"""

from __future__ import annotations

import collections
import sys

import numpy as np

from experiments import in_process
from experiments.ladder import gamma_rules
from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.cross_fit import can_cross_fit, halve_by_case

COLUMNS = ("dataset", "method", "seed", "arm", "split", "rule", "gamma", "site", "dice", "passes")
ARMS = ("softpull", "fine-tuned", "cross-fit")
SHOWN_RULES = ("client-average", "validation", "per-site", "global")


def arm_rows(arm: str, federation: in_process.Federation, chosen_on: gamma_rules.Metrics,
             test: dict[str, SegArrays], passes: dict[str, int]) -> list[tuple]:
    """``(arm, split, rule, gamma, site, Dice, passes)``: every rule's test Dice and its expected validation Dice."""
    rows = []
    for rule, (gamma, dice) in gamma_rules.score_rules(federation, chosen_on, test).items():
        rows += [(arm, "test", rule, gamma, name, value, passes.get(name, "")) for name, value in dice.items()]
        if rule == "per-model":  # its Dice depends on per-model gammas the sweeps do not hold
            continue
        gammas = gamma_rules.site_gammas(rule, chosen_on)
        rows += [(arm, "val", rule, gamma, name,
                  float(chosen_on[name]["dice-super-sweep"][GAMMA_GRID.index(gammas[name])]), passes.get(name, ""))
                 for name in chosen_on]
    return rows


def scorer(max_passes: int):
    """``score(federation) -> rows`` of the three arms, for :func:`~experiments.ladder.gamma_rules.rescore_cells`."""

    def score(federation: in_process.Federation) -> list[tuple]:
        softpull = dict(federation.fedsm.personalized)
        val = {site.name: site.val for site in federation.sites}
        test = {site.name: site.test for site in federation.sites}
        rows = arm_rows("softpull", federation, gamma_rules.sweep(federation, val), test, {})
        halves = {site.name: halve_by_case(site.val) for site in federation.sites if can_cross_fit(site.val)}
        # one fine-tuning run per site, its pass chosen on the whole split and on each half
        tuned = in_process.fine_tune_on_choosers(federation, max_passes,
                                                 {name: [split, *halves.get(name, ())] for name, split in val.items()})
        deployed = {name: found[0].weights for name, found in tuned.items()}
        passes = {name: found[0].passes for name, found in tuned.items()}
        federation.fedsm.personalized.update(deployed)
        whole = gamma_rules.sweep(federation, val)
        rows += arm_rows("fine-tuned", federation, whole, test, passes)
        crossed = in_process.cross_fit_validation(federation, whole, {name: tuned[name][1:] for name in halves})
        rows += arm_rows("cross-fit", federation, crossed, test, passes)
        federation.fedsm.personalized.update(softpull)
        for arm in ARMS:
            means = [np.mean([r[5] for r in rows if r[:3] == (arm, split, "client-average")])
                     for split in ("val", "test")]
            print(f"[cross-fit-gamma]   {arm}: client-average validation {means[0]:.4f}, test {means[1]:.4f}",
                  flush=True)
        return rows

    return score


def table(rows: list[dict[str, str]]) -> str:
    """Markdown: per (dataset, method) and rule, each arm's client-average validation and test Dice over seeds."""
    groups: dict = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    for row in rows:
        cell = groups[(row["dataset"], row["method"])][(row["arm"], row["split"], row["rule"])]
        cell[int(row["seed"])].append(row)
    lines = ["# FedSM's gamma on cross-fitted validation", "",
             "Generated by `python -m experiments.ladder.cross_fit_gamma` from `cross_fit_gamma.csv`. Client-average "
             "Dice, mean over the seeds named; `val`: what the rule expected on the sweeps it chose gamma on; `test`: "
             "at that gamma on test. `fine-tuned`: gamma chosen on the validation split that also chose each site's "
             "fine-tuning pass (what a run does); `cross-fit`: the same models, gamma chosen with each site's own "
             "validation images scored by its model of the pass best on the other half of its split.", ""]
    for (dataset, method), cells in sorted(groups.items()):
        seeds = sorted({seed for by_seed in cells.values() for seed in by_seed})
        lines += [f"## {dataset}, {method} (seeds {', '.join(map(str, seeds))})", "",
                  "| rule | " + " | ".join(f"{arm} val | {arm} test" for arm in ARMS) + " | gamma: "
                  + " / ".join(ARMS) + " |", "|---|" + "---|" * (2 * len(ARMS) + 1)]
        for rule in SHOWN_RULES:
            shown, gammas = [], []
            for arm in ARMS:
                for split in ("val", "test"):
                    by_seed = cells.get((arm, split, rule), {})
                    values = [np.mean([float(r["dice"]) for r in by_seed[s]]) for s in seeds if s in by_seed]
                    shown.append(f"{np.mean(values):.4f}" if values else "")
                gammas.append(", ".join(by_seed[s][0]["gamma"] for s in seeds if s in by_seed))
            lines.append(f"| {rule} | " + " | ".join(shown) + f" | {' / '.join(gammas)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Score the finished FedSM cells or run folders not yet in ``cross_fit_gamma.csv``."""
    args = gamma_rules.arguments(__doc__.split("\n\n")[0], argv, add_options)
    return gamma_rules.rescore_cells(args, "cross_fit_gamma", COLUMNS, scorer(args.max_passes), table)


def add_options(parser) -> None:
    """The most fine-tuning passes (``fine-tune-passes`` of the runs compared)."""
    parser.add_argument("--max-passes", type=int, default=30, help="most passes each site fine-tunes for")


if __name__ == "__main__":
    sys.exit(main())
