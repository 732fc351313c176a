r"""Selector ablation: how each way of training FedSM's selector tells the sites apart, per round.

Usage::

    python -m experiments.paper.selector_study --out experiments/results/selector-ablation \
        --datasets synthetic-fundus experiments/federations/drishti-six-site.toml --seeds 0 1 2

FedSM trains its selector beside the U-Nets but independently of them (each
learner takes its own step on the same minibatch), so its site accuracy can be
studied without the U-Nets: this study runs exactly the selector's part of
every round (the app's initial selector, per-(round, site) seeds and batches,
:func:`~fedsm_core.algorithms.fedsm.client.selector_learner`, averaging of
weights and Adam moments) for three training variants:

* ``default``: site-contrast negatives, equal weights (``selector-negatives = true``),
  moments averaged (the app's default when the committed rows were made);
* ``paper``: plain cross-entropy, weights ``n_k / n`` (Xu et al.);
* ``plain-equal``: plain cross-entropy, equal weights;
* ``local-moments``: ``default``, but each site keeps its selector's Adam
  moments instead of the server averaging them (``selector-moments = local``,
  now the app's default); the difference is what sending the moments buys.

At every evaluated round each variant's selector is scored twice on validation
and test images: with the head federated training left (``selector-head =
"trained"``) and with the head fitted from the sites' embedding statistics
(``"fitted"``, :mod:`fedsm_core.algorithms.fedsm.selector_head`). Rows go to
``results.csv`` after every run (finished runs are skipped when the study is
started again) and the last round's test accuracy to ``table.md``.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np
import torch

from experiments.progress import over_runs
from fedsm_core.algorithms.aggregation import weighted_average
from fedsm_core.algorithms.fedsm.client import selector_learner
from fedsm_core.algorithms.fedsm.selector_head import selector_statistics, with_fitted_head
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import training_dataset
from fedsm_core.data.statistics import channel_statistics, pool_channel_statistics
from fedsm_core.device import set_cpu_threads
from fedsm_core.models.weights import get_weights, set_weights
from fedsm_core.training.local_update import train_on_split
from fedsm_core.training.optimizer_state import adam_state_to_arrays

VARIANTS = {
    # The first three average the selector's Adam moments, as the app did when they were run
    "default": {"selector-negatives": True, "selector-weighting": "equal", "selector-moments": "averaged"},
    "paper": {"selector-negatives": False, "selector-weighting": "size", "selector-moments": "averaged"},
    "plain-equal": {"selector-negatives": False, "selector-weighting": "equal", "selector-moments": "averaged"},
    "local-moments": {"selector-negatives": True, "selector-weighting": "equal", "selector-moments": "local"},
}
COLUMNS = ("dataset", "variant", "seed", "round", "head", "split", "site", "accuracy")


def _accuracy(selector: torch.nn.Module, sites, split: str) -> dict[str, float]:
    """Share of each site's images whose argmax is that site, and the image-weighted pool."""
    selector.eval()
    hits, counts = {}, {}
    with torch.no_grad():
        for index, site in enumerate(sites):
            images = torch.from_numpy(getattr(site, split).images)
            hits[site.name] = float((selector(images).argmax(dim=1) == index).double().sum())
            counts[site.name] = len(images)
    scores = {name: hits[name] / counts[name] for name in hits}
    scores["pooled"] = sum(hits.values()) / sum(counts.values())
    return scores


def run_variant(config: RunConfig, label: str, variant: str, progress=print) -> list[dict[str, object]]:
    """The selector part of ``config.num_server_rounds`` FedSM rounds; accuracy rows of every evaluated round."""
    info = training_dataset(config.dataset, config.held_out_site)
    sites = [info.load_site(i, config.image_size, config.data_scale, config.data_seed) for i in range(info.num_sites)]
    spec = config.model_spec(len(info.structures), info.num_sites)
    torch.manual_seed(config.seed)
    spec.build_segmentation()  # the app builds the U-Net first under this seed: the same selector follows
    selector = spec.build_selector()
    pixels = pool_channel_statistics([channel_statistics(site.train.images) for site in sites])
    selector.set_input_statistics(pixels.mean, pixels.std)
    weights, moments, rows = get_weights(selector), {}, []
    kept: dict[int, dict] = {}  # selector-moments = local: each site's own moments
    for server_round in range(1, config.num_server_rounds + 1):
        replies, sizes = [], []
        for index, site in enumerate(sites):
            settings = config.round_settings(server_round, index)
            torch.manual_seed(settings.seed)
            set_weights(selector, weights, "selector")
            start = kept.get(index, {}) if config.selector_moments == "local" else moments
            learner = selector_learner(selector, start, index, info.num_sites, settings)
            train_on_split([learner], site.train, settings.batch_size, settings.local_epochs,
                           settings.max_local_steps, settings.seed, "cpu", settings.augmentation)
            replies.append((get_weights(selector), adam_state_to_arrays(selector, learner.optimizer)))
            kept[index] = replies[-1][1]
            sizes.append(len(site.train) if config.selector_weighting == "size" else 1.0)
        weights = weighted_average([r[0] for r in replies], sizes)
        if config.selector_moments == "averaged":
            moments = weighted_average([r[1] for r in replies], sizes)
        if server_round % config.eval_every and server_round != config.num_server_rounds:
            continue
        set_weights(selector, weights, "selector")
        heads = {"trained": weights, "fitted": with_fitted_head(
            weights, [selector_statistics(selector, s.train, config.augmentation != "none") for s in sites],
            config.selector_shrinkage)}
        for head, head_weights in heads.items():
            set_weights(selector, head_weights, "selector")
            for split in ("val", "test"):
                rows += [{"dataset": label, "variant": variant, "seed": config.seed, "round": server_round,
                          "head": head, "split": split, "site": name, "accuracy": value}
                         for name, value in _accuracy(selector, sites, split).items()]
        last = {r["head"]: r["accuracy"] for r in rows[-2 * 2 * (len(sites) + 1):]
                if r["split"] == "test" and r["site"] == "pooled"}
        progress(f"[selector-study] {label} {variant} seed {config.seed} round {server_round}: test accuracy "
                 f"trained head {last['trained']:.3f}, fitted head {last['fitted']:.3f}")
    return rows


def ablation_table(rows: list[dict[str, object]]) -> list[str]:
    """Markdown: pooled test accuracy after the last round, mean ± std over seeds, and the worst site."""
    lines = ["| dataset | variant | head | seeds | pooled test accuracy | worst site (mean over seeds) |",
             "|---|---|---|---|---|---|"]
    keys = dict.fromkeys((r["dataset"], r["variant"], r["head"]) for r in rows)
    for dataset, variant, head in keys:
        mine = [r for r in rows if (r["dataset"], r["variant"], r["head"], r["split"]) == (dataset, variant, head,
                                                                                          "test")]
        final = {seed: max(int(r["round"]) for r in mine if r["seed"] == seed) for seed in {r["seed"] for r in mine}}
        last = [r for r in mine if int(r["round"]) == final[r["seed"]]]
        pooled = [float(r["accuracy"]) for r in last if r["site"] == "pooled"]
        per_site = {}
        for r in last:
            if r["site"] != "pooled":
                per_site.setdefault(r["site"], []).append(float(r["accuracy"]))
        worst = min(per_site, key=lambda s: np.mean(per_site[s]))
        spread = f" ± {np.std(pooled, ddof=1):.3f}" if len(pooled) > 1 else ""
        lines.append(f"| {dataset} | {variant} | {head} | {len(pooled)} | {np.mean(pooled):.3f}{spread} | "
                     f"{worst} {np.mean(per_site[worst]):.3f} |")
    return lines


def _read(path: Path) -> list[dict[str, object]]:
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["synthetic-fundus"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=RunConfig.num_server_rounds)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.csv"
    rows = _read(results)
    done = {(r["dataset"], r["variant"], int(r["seed"])) for r in rows}
    jobs = [(d, v, s) for d in args.datasets for s in args.seeds for v in args.variants
            if (Path(d).stem, v, s) not in done]
    started = time.monotonic()
    for count, (dataset, variant, seed) in enumerate(over_runs(jobs, "selector study"), start=1):
        config = RunConfig.from_mapping({**VARIANTS[variant], "dataset": str(Path(dataset).resolve())
                                         if dataset.endswith(".toml") else dataset,
                                         "seed": seed, "num-server-rounds": args.rounds})
        set_cpu_threads(config.torch_threads)
        rows += run_variant(config, Path(dataset).stem, variant)
        with results.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        (args.out / "table.md").write_text("Selector site accuracy after the last round (test split).\n\n"
                                           + "\n".join(ablation_table(rows)) + "\n")
        elapsed = time.monotonic() - started
        print(f"[selector-study] {count}/{len(jobs)} runs done, {elapsed:.0f} s, about "
              f"{elapsed / count * (len(jobs) - count):.0f} s left", flush=True)
    print("\n".join(ablation_table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
