"""Leave-one-site-out: how FedSM's super model serves a hospital it never saw (paper Table 5).

Usage::

    python -m experiments.paper.heldout --site all --out results/heldout
    python -m experiments.paper.heldout --site site-3 --run-config "num-server-rounds=20"
    python -m experiments.paper.heldout --site site-3 --bundle runs/<run>/super_model.pt

For each held-out site, FedSM is trained on the other sites through the same
Flower simulation as any run (``held-out-site`` in the run config), or a
finished run's bundle is loaded. On the held-out site's test images the
script reports the share of images routed to the global model and to each
personalized model, and the Dice of every model and of the super model at
gamma = 0, at the run's gamma (chosen on the training sites' validation
data), at the calibrated gamma (training sites' validation data, each site
left out of the selector in turn, temperature-scaled selector, and only
images familiar to their chosen site routed: :mod:`fedsm_core.analysis.familiarity`)
at the local gamma (the best on the held-out site's own labelled validation images, as a
hospital that labels a few images when it joins would choose it) and at the oracle gamma
(best on the held-out test data: reported, never used).

Writes to ``--out``: ``heldout.md``, ``heldout.csv`` (long format),
``dice_vs_gamma.png`` and ``selector_features.png`` (PCA of the selector
features of every site's test images, held-out sites marked).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from experiments.paper.heldout_report import plot_features, plot_gamma_curves, result_rows, result_table
from experiments.progress import over_runs
from experiments.runner import ROOT, launch_run, parse_overrides
from fedsm_core.analysis.familiarity import fit_site_regions
from fedsm_core.analysis.held_out import HeldOutResult, analyse_held_out
from fedsm_core.analysis.model_scores import score_every_model, selector_features
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import dataset_info
from fedsm_core.device import select_device, set_cpu_threads
from fedsm_core.run_files.bundle import load_bundle


def train_without(site: str, overrides: dict[str, object], out: Path) -> Path:
    """A FedSM run on every site but ``site``; returns its bundle path.

    A finished run (a ``super_model.pt``) already under ``out/runs/without-<site>``
    is reused, so an interrupted ``--site all`` continues where it stopped.
    """
    runs = out / "runs" / f"without-{site}"
    finished = sorted(runs.glob("*/super_model.pt"), key=lambda p: p.stat().st_mtime) if runs.is_dir() else []
    if finished:
        print(f"[heldout {site}] reusing {finished[-1]}", flush=True)
        return finished[-1]
    settings = {**overrides, "strategy": "fedsm", "held-out-site": site}
    return launch_run(settings, runs, f"heldout {site}") / "super_model.pt"


def evaluate_held_out(site: str, bundle: Path, config: RunConfig, temperature_scaling: bool,
                      familiarity: bool = True) -> tuple[HeldOutResult, dict]:
    """Score ``bundle`` on ``site``'s test images; also return test features of every site."""
    device = select_device(config.device)
    model, info = load_bundle(bundle, device)
    if model.selector_includes_global:
        raise ValueError(f"{bundle} is a FedSM-extra bundle; held-out analysis needs a FedSM bundle with gamma")
    if site in info.site_names:
        raise ValueError(f"{bundle} was trained with site '{site}'; train without it (held-out-site) first")
    dataset = dataset_info(config.dataset)
    splits = {name: dataset.load_site(i, info.image_size, config.data_scale, config.data_seed)
              for i, name in enumerate(dataset.site_names)}
    val = {name: score_every_model(model, splits[name].val, device=device) for name in info.site_names}
    tests = {name: score_every_model(model, s.test, device=device) for name, s in splits.items()}
    regions = None
    if familiarity:
        train = {name: selector_features(model, splits[name].train, device=device) for name in info.site_names}
        regions = fit_site_regions(train, {name: val[name].features for name in info.site_names}, info.site_names)
    own_val = score_every_model(model, splits[site].val, device=device)  # the new site's few labelled images
    result = analyse_held_out(site, tests[site], val, info.site_names, info.gamma, temperature_scaling,
                              regions=regions, site_val=own_val)
    return result, {name: scores.features for name, scores in tests.items()}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", required=True, help="the held-out site's name, or 'all'")
    parser.add_argument("--bundle", type=Path, help="a finished run's super_model.pt trained without --site")
    parser.add_argument("--run-config", default="", help='overrides for training, e.g. "num-server-rounds=20"')
    parser.add_argument("--no-temperature-scaling", action="store_true")
    parser.add_argument("--no-familiarity", action="store_true",
                        help="route by confidence alone, also images unlike every training site")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "heldout")
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.run_config)
    config = RunConfig.from_mapping(overrides)
    set_cpu_threads(config.torch_threads)  # more threads than free cores slows training several-fold
    names = dataset_info(config.dataset).site_names
    sites = list(names) if args.site == "all" else [args.site]
    if any(site not in names for site in sites):
        parser.error(f"--site {args.site}: expected one of {list(names)} or 'all'")
    if args.bundle is not None and len(sites) != 1:
        parser.error("--bundle needs a single --site")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results, features = [], {}
    for site in over_runs(sites, "held-out sites"):
        bundle = args.bundle or train_without(site, overrides, args.out)
        result, features[site] = evaluate_held_out(site, bundle, config, not args.no_temperature_scaling,
                                                   not args.no_familiarity)
        results.append(result)
        _write(args.out, results, features, f"settings `{args.run_config}`, {time.monotonic() - started:.0f} s")
        print(f"[heldout] {site}: super Dice at calibrated gamma {result.dice['super@calibrated']:.4f}", flush=True)
    print((args.out / "heldout.md").read_text())
    return 0


def _write(out: Path, results: list[HeldOutResult], features: dict, header: str) -> None:
    with (out / "heldout.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["held-out-site", "quantity", "key", "value"])
        writer.writeheader()
        for result in results:
            writer.writerows(result_rows(result))
    (out / "heldout.md").write_text(f"Held-out sites ({header})\n\n" + "\n".join(result_table(results)) + "\n")
    plot_gamma_curves(out / "dice_vs_gamma.png", results)
    plot_features(out / "selector_features.png", features, [r.site for r in results])


if __name__ == "__main__":
    sys.exit(main())
