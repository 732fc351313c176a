r"""Compare methods on one dataset over several seeds (the paper's Table 3 and Figure 2).

Usage::

    python -m experiments.paper.compare --out results/compare --seeds 0 1 2 \
        --methods centralized local fedavg fedprox scaffold fedsm fedsm-extra \
                  fedbn harmofl fedsm-ampnorm knn-per fedsm-knn-per fedsm-softpull \
        --run-config "num-server-rounds=15"

Federated methods run through ``scripts/run-simulation.sh`` (the same Flower
app and ClientApp as any run); ``centralized`` (pooled sites) and ``local``
(one model per site, evaluated on every site) run in this process on the same
core code with as many passes over the data as the federated runs make
(``num-server-rounds * local-epochs``). Every method is scored on each site's
test split once, with the settings given; choose them on validation data first.

Writes to ``--out``: ``results.csv`` (long format: method, seed, site or
``pooled``, metric, value, config), ``table.md`` and ``curves.png`` (best
validation Dice so far per round, first seed; the centralized run's best
validation Dice as a horizontal line).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from experiments.paper.comparison_table import comparison_table, plot_curves, write_long_csv
from experiments.progress import over_runs
from experiments.runner import (
    FEDERATED,
    METHODS,
    ROOT,
    describe_chosen,
    load_chosen,
    parse_overrides,
    run_federated,
    run_pooled,
)
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import dataset_info


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--run-config", default="", help='overrides, e.g. "num-server-rounds=15 lr=0.002"')
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "compare")
    parser.add_argument("--chosen", type=Path, default=None,
                        help="per-method overrides chosen on validation (chosen.json of experiments.paper.tune)")
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.run_config)
    chosen = load_chosen(args.chosen, overrides)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows: list[dict] = []
    curves: dict[str, list] = {}
    centralized_best: list[float] = []
    for seed in over_runs(args.seeds, "comparison seeds"):
        pooled_rows, curve = run_pooled(args.methods, seed, chosen["centralized"])
        rows += pooled_rows
        if curve:
            centralized_best.append(max(value for _, value in curve))
        for method in [m for m in args.methods if m in FEDERATED]:
            method_rows, method_curve = run_federated(method, seed, chosen[method], args.out)
            rows += method_rows
            if seed == args.seeds[0] and method_rows:
                curves[method_rows[0]["method"]] = method_curve
        write_long_csv(args.out / "results.csv", rows)
    sites = list(dataset_info(RunConfig.from_mapping(overrides).dataset).site_names)
    table = comparison_table(rows, sites)
    wall = time.monotonic() - started
    (args.out / "table.md").write_text(
        f"Test Dice (mean ± std over seeds {args.seeds}); settings: `{args.run_config}`; wall time {wall:.0f} s\n\n"
        + "\n".join(table) + "\n\n" + describe_chosen(chosen, overrides, args.methods) + "\n")
    reference = None
    if centralized_best:
        reference = ("Centralized (best validation)", sum(centralized_best) / len(centralized_best))
    plot_curves(args.out / "curves.png", curves, reference)
    print("\n".join(table))
    print(f"[compare] wrote {args.out} in {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
