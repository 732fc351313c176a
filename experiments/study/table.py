r"""``table.md`` and ``curves.png`` of a study, from its long CSV alone.

Usage (the study writes both after every run; this regenerates them)::

    python -m experiments.study.table --csv experiments/results/reference/results.csv \
        --out experiments/results/reference/table.md --curves experiments/results/reference/curves.png

One table per dataset in the layout of Table 3 of Xu et al. (2022): a row per
method, a column per site, the client average (mean of the site columns) and
the pooled Dice over all test images, each as mean ± std over seeds of the
Dice the runs reported. Two more columns give a 95 % bootstrap interval of the
client average and of the pooled Dice (mean over seeds) over test images:
every draw resamples each site's test images with replacement, separately per
seed (each seed has its own test set where ``data-seed`` changes the split), so
the interval shows how much the few test images of a site move the result.
The generator of each (dataset, method) is seeded from their names, so the
file is byte-identical for the same CSV. Datasets whose test images are slices
of cases (``synthetic-prostate``, NIfTI volumes) get a second table: the slice
Dice (the paper's metric) beside the per-case 3-D Dice and HD95 of the same
model (:data:`experiments.study.runs.CASE_KINDS`). Every method's gap to
centralized training follows the first table, with a paired interval
(:mod:`experiments.study.gap_table`). Last, the speed table: rounds
to reach centralized training's best validation Dice minus one point
(:mod:`experiments.study.speed_table`); FedSM's final fine-tuning passes count
there, read from the run configs recorded beside the CSV (``run-configs.jsonl``).

A study that spans sittings has seeds that only some methods have finished.
Each dataset's tables and curves hold only the seeds every method of that
dataset has finished (:func:`comparable_seeds`), so no method's mean covers
seeds another's does not; a line under the heading names the seeds left out
and the methods that have finished them, and a last table lists those seeds'
client averages per method, apart from every mean (:func:`left_out_table`).
"""

from __future__ import annotations

import argparse
import re
import sys
import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from experiments.paper.comparison_table import best_so_far, comparison_table, mean_std
from experiments.runner import FEDERATED
from experiments.study.gap_table import gap_table
from experiments.study.run_configs import read_configs
from experiments.study.runs import CASE_KINDS, PART_KINDS, read_rows
from experiments.study.speed_table import passes_after_last_round, speed_table, validation_curves

DISPLAY = {"centralized": "Centralized", **FEDERATED}
DRAWS = 2000
POOLED = "pooled"


def _natural(text: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def bootstrap_interval(per_seed: Sequence[Mapping[str, np.ndarray]], draws: int,
                       rng: np.random.Generator) -> tuple[tuple[float, float], tuple[float, float]]:
    """95 % percentile intervals of the client-average and the pooled Dice, means over seeds.

    Parameters
    ----------
    per_seed : sequence of mapping
        Per seed: site -> Dice of its test images (with foreground).
    draws : int
        Bootstrap draws; each resamples every (seed, site) image set with replacement.

    Returns
    -------
    tuple
        ``((client low, client high), (pooled low, pooled high))``.
    """
    client, pooled = np.zeros(draws), np.zeros(draws)
    for sites in per_seed:
        means, sums, count = [], np.zeros(draws), 0
        for dice in sites.values():
            sample = dice[rng.integers(0, len(dice), size=(draws, len(dice)))]
            means.append(sample.mean(axis=1))
            sums += sample.sum(axis=1)
            count += len(dice)
        client += np.mean(means, axis=0) / len(per_seed)
        pooled += sums / count / len(per_seed)
    low, high = (2.5, 97.5)
    return ((float(np.percentile(client, low)), float(np.percentile(client, high))),
            (float(np.percentile(pooled, low)), float(np.percentile(pooled, high))))


def _images(rows: Sequence[Mapping[str, str]]) -> list[dict[str, np.ndarray]]:
    by_seed: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_seed[row["seed"]][row["site"]].append(float(row["value"]))
    return [{site: np.asarray(values) for site, values in sites.items()} for _, sites in sorted(by_seed.items())]


def finished_seeds(rows: Sequence[Mapping[str, str]], dataset: str) -> dict[str, set[str]]:
    """Method -> the seeds with test rows in ``dataset``, methods in the CSV's order."""
    found: dict[str, set[str]] = {}
    for row in rows:
        if row["dataset"] == dataset and row["kind"] == "test":
            found.setdefault(row["method"], set()).add(row["seed"])
    return found


def comparable_seeds(finished: Mapping[str, set[str]]) -> list[str]:
    """The seeds every method has finished, in numeric order: the only ones a fair comparison may average."""
    common = set.intersection(*map(set, finished.values())) if finished else set()
    return sorted(common, key=int)


def seeds_note(finished: Mapping[str, set[str]], kept: Sequence[str]) -> str:
    """The sentence under a dataset's heading: the seeds in its tables and those left out, with who finished them."""
    left = sorted(set().union(*finished.values()) - set(kept), key=int)
    text = (f"Seed{'s' if len(kept) > 1 else ''} {', '.join(kept)}." if kept
            else "No seed has been finished by every method yet.")
    for seed in left:
        done = [DISPLAY.get(m, m) for m, seeds in finished.items() if seed in seeds]
        text += (f" Seed {seed} is left out until every method has finished it"
                 f" ({len(done)} of {len(finished)} have: {', '.join(done)}).")
    return text


def comparable_rows(rows: Sequence[Mapping[str, str]], dataset: str) -> tuple[list[Mapping[str, str]], str]:
    """``dataset``'s rows of the seeds every method has finished, and the note that says which those are."""
    finished = finished_seeds(rows, dataset)
    kept = comparable_seeds(finished)
    mine = [r for r in rows if r["dataset"] == dataset and r["seed"] in kept]
    return mine, seeds_note(finished, kept)


def dataset_table(rows: Sequence[Mapping[str, str]], dataset: str, draws: int = DRAWS) -> list[str]:
    """Markdown lines of one dataset: the Table 3 layout plus bootstrap intervals and rounds per seed."""
    mine = [r for r in rows if r["dataset"] == dataset]
    tests = [r for r in mine if r["kind"] == "test"]
    sites = sorted({r["site"] for r in tests if r["site"] != POOLED}, key=_natural)
    methods = list(dict.fromkeys(r["method"] for r in tests))
    long = [{"method": DISPLAY.get(r["method"], r["method"]), "seed": r["seed"], "site": r["site"],
             "metric": "dice", "value": r["value"]} for r in tests]
    lines = comparison_table(long, sites)
    lines[0] += " client avg 95 % CI | pooled 95 % CI | rounds per seed |"
    lines[1] += "---|---|---|"
    for index, method in enumerate(methods):
        images = _images([r for r in mine if r["method"] == method and r["kind"] == "image"])
        cells = ["-", "-"]
        if images:
            rng = np.random.default_rng(zlib.crc32(f"{dataset}/{method}".encode()))
            intervals = bootstrap_interval(images, draws, rng)
            cells = [f"[{low:.4f}, {high:.4f}]" for low, high in intervals]
        rounds = {r["seed"]: r["round"] for r in tests if r["method"] == method}
        cells.append("/".join(rounds[s] for s in sorted(rounds, key=int)))
        lines[2 + index] += " " + " | ".join(cells) + " |"
    return lines


def client_averages(rows: Sequence[Mapping[str, str]], kind: str) -> dict[str, float]:
    """Seed -> the mean over sites (pooled left out) of the rows of ``kind``."""
    by_seed: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row["kind"] == kind and row["site"] != POOLED:
            by_seed[row["seed"]].append(float(row["value"]))
    return {seed: float(np.mean(values)) for seed, values in by_seed.items()}


def parts_table(rows: Sequence[Mapping[str, str]], dataset: str) -> list[str]:
    """Markdown lines: the super model against its own parts, client-average test Dice, mean ± std over seeds.

    The gain is ``super - max(global alone, own personalized alone)`` per seed:
    what routing adds over the better of the two models it routes between.
    """
    mine = [r for r in rows if r["dataset"] == dataset]
    methods = list(dict.fromkeys(r["method"] for r in mine if r["kind"] in PART_KINDS))
    if not methods:
        return []
    lines = ["Super model against its parts (client average of the test Dice):", "",
             "| method | global model alone | own personalized model | super model | super - better part | seeds |",
             "|---|---|---|---|---|---|"]
    for method in methods:
        runs = [r for r in mine if r["method"] == method]
        alone, own, routed = (client_averages(runs, kind) for kind in (*PART_KINDS, "test"))
        seeds = sorted(set(alone) & set(own) & set(routed), key=int)
        gain = [routed[s] - max(alone[s], own[s]) for s in seeds]
        cells = [mean_std([part[s] for s in seeds]) for part in (alone, own, routed)]
        lines.append(f"| {DISPLAY.get(method, method)} | " + " | ".join([*cells, mean_std(gain), str(len(seeds))])
                     + " |")
    return lines


def cases_table(rows: Sequence[Mapping[str, str]], dataset: str) -> list[str]:
    """Markdown lines: slice Dice (the paper's) beside the per-case 3-D scores, for datasets of cases.

    Client averages over the test sites of each seed, then mean ± std over
    seeds; empty for a dataset without case rows (2-D images). HD95 in
    millimetres needs every test case's voxel spacing, else ``-``.
    """
    mine = [r for r in rows if r["dataset"] == dataset]
    methods = list(dict.fromkeys(r["method"] for r in mine if r["kind"] in CASE_KINDS))
    if not methods:
        return []
    lines = ["Per case (the slices of a case stacked back into its volume; client average of the test sites):", "",
             "| method | slice Dice (paper) | per-case 3-D Dice | HD95 (voxels) | HD95 (mm) | seeds |",
             "|---|---|---|---|---|---|"]
    for method in methods:
        runs = [r for r in mine if r["method"] == method]
        columns = [client_averages(runs, kind) for kind in ("test", *CASE_KINDS)]
        seeds = sorted(set(columns[0]) & set(columns[1]), key=int)
        cells = [mean_std([column[s] for s in seeds]) if all(s in column for s in seeds) else "-"
                 for column in columns]
        lines.append(f"| {DISPLAY.get(method, method)} | " + " | ".join([*cells, str(len(seeds))]) + " |")
    return lines


def left_out_table(rows: Sequence[Mapping[str, str]], dataset: str) -> list[str]:
    """Markdown lines: client-average test Dice of the seeds not every method has finished yet, per method.

    They stay out of every mean and interval (:func:`comparable_seeds`); shown so
    that a study under way can be read from this file rather than from the CSV.
    Empty when none is left out.
    """
    finished = finished_seeds(rows, dataset)
    left = sorted(set().union(*finished.values()) - set(comparable_seeds(finished)), key=int) if finished else []
    if not left:
        return []
    lines = ["Client-average test Dice of the seeds left out (finished runs only; in no mean or interval above):", "",
             "| method | " + " | ".join(f"seed {seed}" for seed in left) + " |", "|---|" + "---|" * len(left)]
    for method in finished:
        scores = client_averages([r for r in rows if r["dataset"] == dataset and r["method"] == method], "test")
        lines.append(f"| {DISPLAY.get(method, method)} | "
                     + " | ".join(f"{scores[seed]:.4f}" if seed in scores else "-" for seed in left) + " |")
    return lines


def study_table(rows: Sequence[Mapping[str, str]], draws: int = DRAWS,
                after_last: Mapping[str, int] | None = None) -> str:
    """The whole ``table.md``: one section per dataset, in the CSV's order.

    ``after_last``: run hash -> local passes trained after the last round
    (:func:`~experiments.study.speed_table.passes_after_last_round`), which the speed table counts.
    """
    text = ["Test Dice, mean ± std over the seeds every method of a dataset has finished (named under its heading); "
            f"95 % intervals: bootstrap over test images ({draws} draws). "
            "Regenerate: `python -m experiments.study.table --csv results.csv --out table.md`.", ""]
    for dataset in dict.fromkeys(r["dataset"] for r in rows if r["kind"] == "test"):
        mine, note = comparable_rows(rows, dataset)
        text += [f"## {dataset}", "", note, ""]
        if mine:
            text += [*dataset_table(mine, dataset, draws), ""]
        speed = speed_table(mine, dataset, DISPLAY, after_last=after_last)
        gaps, left = gap_table(mine, dataset, DISPLAY, draws), left_out_table(rows, dataset)
        for extra in (gaps, cases_table(mine, dataset), parts_table(mine, dataset), speed, left):
            text += [*extra, ""] if extra else []
    return "\n".join(text)


def mean_curves(rows: Sequence[Mapping[str, str]], dataset: str) -> dict[str, list[tuple[int, float]]]:
    """Per method: best validation Dice so far per round, averaged over the seeds that reached the round."""
    curves = {}
    for method, seeds in validation_curves(rows, dataset).items():
        at: dict[int, list[float]] = defaultdict(list)
        for curve in seeds.values():
            for server_round, best in best_so_far(curve):
                at[server_round].append(best)
        curves[DISPLAY.get(method, method)] = [(r, float(np.mean(v))) for r, v in sorted(at.items())]
    return curves


def curve_styles(curves: Mapping[str, list[tuple[int, float]]]) -> list[tuple[str, list, str, str]]:
    """``(method, curve, legend label, line style)``; a curve that retraces an earlier one is dashed and named.

    kNN-Per validates FedAvg's global model, and FedSM-extra's super model is its
    global model (FedAvg's, same seed) until the selector rounds: drawn plainly,
    they would hide FedAvg's line. A curve retraces another when the two agree
    at every round both have; the label says up to which round.
    """
    styled = []
    for index, (name, curve) in enumerate(curves.items()):
        ends = ((other, _shared_end(earlier, curve)) for other, earlier in list(curves.items())[:index])
        same = next(((other, last) for other, last in ends if last), None)
        if same is None:
            styled.append((name, curve, name, "-"))
        else:
            other, last = same
            whole = last == curve[-1][0] == curves[other][-1][0]
            styled.append((name, curve, f"{name} (= {other}{'' if whole else f' to round {last}'})", "--"))
    return styled


def _shared_end(first: list[tuple[int, float]], second: list[tuple[int, float]]) -> int | None:
    """The last round both curves have, when they agree at every round both have (``None`` otherwise)."""
    values = dict(first)
    shared = [(r, v) for r, v in second if r in values]
    if len(shared) < 2 or any(values[r] != v for r, v in shared):
        return None
    return shared[-1][0]


def plot_study_curves(path: str | Path, rows: Sequence[Mapping[str, str]]) -> Path:
    """``curves.png``: one panel per dataset, one line per method (centralized: per epoch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in rows if r["kind"] == "val")) or ["(no runs yet)"]
    figure, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 4.2), squeeze=False)
    for axis, dataset in zip(axes[0], datasets, strict=True):
        for _name, curve, label, style in curve_styles(mean_curves(comparable_rows(rows, dataset)[0], dataset)):
            axis.plot([r for r, _ in curve], [v for _, v in curve], label=label, linestyle=style)
        axis.set_title(dataset)
        axis.set_xlabel("round (centralized: epoch)")
        axis.set_ylabel("best pooled validation Dice so far")
        axis.grid(alpha=0.3)
        if axis.lines:  # a dataset whose runs have not finished yet has no curve to name
            axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def study_table_of(csv: Path, draws: int = DRAWS) -> str:
    """:func:`study_table` of a study's ``results.csv``, with the run configs recorded beside it (if any)."""
    return study_table(read_rows(csv), draws, passes_after_last_round(read_configs(csv.parent).values()))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, required=True, help="the study's long CSV (results.csv)")
    parser.add_argument("--out", type=Path, required=True, help="where table.md goes")
    parser.add_argument("--curves", type=Path, default=None, help="also write curves.png here")
    parser.add_argument("--draws", type=int, default=DRAWS, help="bootstrap draws")
    args = parser.parse_args(argv)
    args.out.write_text(study_table_of(args.csv, args.draws))
    if args.curves is not None:
        plot_study_curves(args.curves, read_rows(args.csv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
