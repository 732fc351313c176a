"""Time cost of HarmoFL's components in one site's local round.

Usage::

    python -m experiments.bench.harmofl_cost --site 5 --repeats 3 --out results/harmofl-cost.json

Runs one local round (FedAvg's client, the same code a Flower client runs) on
one site of the default generated dataset, four ways: plain, with amplitude
normalization, with weight perturbation (alpha = 0.05), and with both
(HarmoFL), and reports the median wall time of each and its ratio to plain.
Weight perturbation takes a second forward and backward pass per step, so it
should cost close to 2x; amplitude normalization adds two FFTs per batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from fedsm_core.algorithms.baselines.global_client import GlobalClientOptions, train_global_client
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import dataset_info
from fedsm_core.device import select_device, set_cpu_threads
from fedsm_core.models.weights import get_weights

VARIANTS = {
    "plain": {},
    "amplitude normalization": {"amplitude-normalization": True},
    "weight perturbation": {"weight-perturbation": True},
    "HarmoFL (both)": {"strategy": "harmofl"},
}


def time_variant(settings: dict[str, object], site_index: int, repeats: int) -> dict[str, float]:
    """Median seconds of one local round and seconds per step, over ``repeats`` rounds."""
    config = RunConfig.from_mapping(settings)
    set_cpu_threads(config.torch_threads)
    info = dataset_info(config.dataset)
    site = info.load_site(site_index, config.image_size, config.data_scale, config.data_seed)
    spec = config.model_spec(len(info.structures), info.num_sites)
    torch.manual_seed(config.seed)
    weights = get_weights(spec.build_segmentation())
    train = RoundSettings(config.batch_size, config.local_epochs, config.max_local_steps, config.lr,
                          config.selector_lr, config.seed, augmentation=config.augmentation,
                          perturbation_alpha=config.harmofl_settings.active_perturbation_alpha)
    device = select_device(config.device)
    times, steps = [], 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        _, metrics = train_global_client(weights, site.train, spec, train, GlobalClientOptions(), device)
        times.append(time.perf_counter() - started)
        steps = metrics["steps"]
    median = statistics.median(times)
    return {"seconds-per-round": median, "steps": steps, "seconds-per-step": median / max(steps, 1.0)}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=int, default=5, help="site index of the default dataset (5 = the largest)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run-config", default="", help='overrides, e.g. "image-size=128"')
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats = {args.repeats} must be >= 1")
    from experiments.runner import parse_overrides  # the same key=value syntax as the comparison
    overrides = parse_overrides(args.run_config)
    results = {}
    for name, extra in VARIANTS.items():
        print(f"[harmofl-cost] {name} ...", flush=True)
        results[name] = time_variant({**overrides, **extra}, args.site, args.repeats)
    plain = results["plain"]["seconds-per-round"]
    print("| variant | s / round | s / step | vs plain |\n|---|---|---|---|")
    for name, result in results.items():
        result["ratio"] = result["seconds-per-round"] / plain
        print(f"| {name} | {result['seconds-per-round']:.2f} | {result['seconds-per-step']:.3f} "
              f"| {result['ratio']:.2f}x |")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
