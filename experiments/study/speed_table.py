"""How fast each method of a study reaches pooled training: the speed table under each dataset of ``table.md``.

The issue's speed target reads: a federated method is within one point of
centralized training's best validation Dice in at most twice the passes
centralized training needs to get there. Per seed the target is
centralized's best pooled validation Dice minus ``MARGIN``; the table gives,
per method and seed, the first validated round whose pooled validation Dice
reaches it (centralized: the first pass), and that round over centralized's
passes. Federated runs are validated every few rounds (``eval-every``), so
their count is an upper bound at that resolution; centralized training is
validated after every pass.

The curve is the one the study stores (``kind = "val"``): the pooled
validation Dice of the method's reported model, or of the global model where
that model is scored at test time only (kNN-Per). FedSM's last point comes
after its final fine-tuning (``fine-tune-passes``): every site trains that
many more local passes after the last round before the last validation, so
the point counts them (:func:`passes_after_last_round`), as a round counts
its one local pass per site.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from fedsm_core.methods import METHODS

MARGIN = 0.01
CENTRALIZED = "centralized"


def rounds_to(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first round of ``(round, Dice)`` pairs whose Dice reaches ``target``; None if none does."""
    return next((r for r, dice in sorted(curve) if dice >= target), None)


def passes_after_last_round(records: Iterable[Mapping[str, object]]) -> dict[str, int]:
    """Run hash -> local passes every site trained after the last round, before the run's last validation.

    ``records`` are a study's run-config records (``run-configs.jsonl``,
    :func:`experiments.study.run_configs.read_configs`). Only FedSM's strategy
    trains after its last round: its final fine-tuning, ``fine-tune-passes``
    passes at each site (FedSM-extra and the other strategies ignore the key).
    """
    passes = {}
    for record in records:
        method, config = str(record["method"]), record["config"]
        fine_tuning = int(config.get("fine-tune-passes", 0)) if isinstance(config, Mapping) else 0
        if method in METHODS and METHODS[method].strategy == "fedsm" and fine_tuning > 0:
            passes[str(record["run"])] = fine_tuning
    return passes


def validation_curves(rows: Sequence[Mapping[str, str]], dataset: str,
                      after_last: Mapping[str, int] | None = None) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Method -> seed -> the stored pooled validation curve of ``dataset``, in round order.

    ``after_last`` (run hash -> passes, :func:`passes_after_last_round`) moves
    the last point of those runs' curves that many passes later.
    """
    curves: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    runs = {}
    for row in rows:
        if row["dataset"] == dataset and row["kind"] == "val":
            curves[row["method"]][row["seed"]].append((int(row["round"]), float(row["value"])))
            runs[row["method"], row["seed"]] = row.get("run", "")
    for (method, seed), run in runs.items():
        curve = curves[method][seed] = sorted(curves[method][seed])
        if (after_last or {}).get(run):
            curve[-1] = (curve[-1][0] + after_last[run], curve[-1][1])
    return curves


def rounds_to_target(curves: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]],
                     margin: float = MARGIN) -> dict[str, dict[str, int | None]]:
    """Method -> seed -> rounds to centralized's best validation Dice of that seed minus ``margin``.

    Seeds centralized training has not finished are left out: they have no target.
    """
    targets = {seed: max(dice for _, dice in curve) - margin for seed, curve in curves.get(CENTRALIZED, {}).items()}
    return {method: {seed: rounds_to(seeds[seed], targets[seed]) for seed in sorted(seeds, key=int) if seed in targets}
            for method, seeds in curves.items()}


def _ratios(mine: Mapping[str, int | None], passes: Mapping[str, int | None]) -> list[float | None]:
    """Per seed: the method's rounds over centralized's passes (None where either never reached the target)."""
    return [None if mine[s] is None or not passes.get(s) else mine[s] / passes[s] for s in mine]


def _fine_tuning_note(rows: Sequence[Mapping[str, str]], dataset: str, after_last: Mapping[str, int] | None) -> str:
    """Says that FedSM's last point counts its fine-tuning passes, where some run of ``dataset`` has them."""
    tuned = {row.get("run", "") for row in rows if row["dataset"] == dataset} & set(after_last or {})
    passes = sorted({(after_last or {})[run] for run in tuned})
    if not passes:
        return ""
    return (f"; FedSM's last point counts the {'/'.join(map(str, passes))} local passes of its final fine-tuning "
            "after the last round")


def speed_table(rows: Sequence[Mapping[str, str]], dataset: str, display: Mapping[str, str],
                margin: float = MARGIN, after_last: Mapping[str, int] | None = None) -> list[str]:
    """Markdown lines of ``dataset``'s speed table; empty where centralized training has no finished seed.

    ``after_last``: passes trained after the last round, per run hash (:func:`validation_curves`).
    """
    reached = rounds_to_target(validation_curves(rows, dataset, after_last), margin)
    passes = reached.get(CENTRALIZED, {})
    if not passes:
        return []
    lines = [f"Rounds (centralized: passes) to reach centralized's best pooled validation Dice minus {margin:g} on "
             "the same seed (federated runs are validated every few rounds: the first validated round that reaches "
             f"it; `-`: never reached{_fine_tuning_note(rows, dataset, after_last)}):", "",
             "| method | rounds per seed | over centralized's passes, per seed | mean ratio | at most twice |",
             "|---|---|---|---|---|"]
    for method, mine in reached.items():
        ratios = _ratios(mine, passes)
        cells = ["/".join("-" if r is None else str(r) for r in mine.values()),
                 "/".join("-" if q is None else f"{q:.2f}" for q in ratios)]
        known = [q for q in ratios if q is not None]
        cells.append(f"{np.mean(known):.2f}" if known and len(known) == len(ratios) else "-")
        cells.append(f"{sum(q is not None and q <= 2 for q in ratios)} of {len(ratios)} seeds")
        lines.append(f"| {display.get(method, method)} | " + " | ".join(cells) + " |")
    return lines
