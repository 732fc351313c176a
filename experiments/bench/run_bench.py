"""Performance benchmark of the FedSM app: bytes on the wire, framework overhead, memory, scaling.

Usage::

    python -m experiments.bench.run_bench --out results/bench                # the full benchmark
    python -m experiments.bench.run_bench --out results/bench-quick --quick  # 2 rounds, 2 and 6 sites, 64 px
    python -m experiments.bench.run_bench --out results/bench --parts wire overhead

Parts (``--parts``, all by default):

``wire``
    bytes per site, round, direction and message type, measured by the
    ServerApp (``traffic.csv`` of the 6-site run), against the paper's
    accounting, this app's and sending all K personalized models;
``overhead``
    the 6-site run through ``flwr run`` against the same training as a plain
    loop in this process (:mod:`experiments.in_process`), per round and total;
``memory``
    peak summed RSS (and PSS) of all processes of a run for each of ``--sites``;
    for the 6-site run, each process's role, RSS, PSS and anonymous memory
    at the peak, and what importing the ClientApp costs a fresh process;
``scaling``
    time per round for each of ``--sites`` and, with 6 sites, each of ``--sizes``,
    and ``scaling.png``: round time and peak memory against the number of sites;
``gpu``
    with a CUDA GPU, the in-process loop at 256 px on it: GPU time per round
    and training images per second; skipped (and said so) without one.

Each configuration runs once through ``flwr run`` and serves every part that
needs it. Writes ``results.json`` (after every run) and ``report.md`` to ``--out``.
This is a measurement, not a test: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from experiments.bench.process_memory import import_cost
from experiments.bench.report import write_report
from experiments.bench.runs import flwr_environment, model_bytes, run_flwr
from experiments.in_process import run_in_process
from experiments.runner import parse_overrides
from fedsm_core.config import RunConfig

PARTS = ("wire", "overhead", "memory", "scaling", "gpu")
BASE_SITES = 6
GPU_IMAGE_SIZE = 256
ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to run: parts, rounds, data scale, site counts, image sizes and extra run-config keys."""

    parts: tuple[str, ...]
    rounds: int
    data_scale: float
    sites: tuple[int, ...]
    sizes: tuple[int, ...]
    overrides: dict[str, object]

    def settings(self, sites: int, image_size: int) -> dict[str, object]:
        """Run config of one configuration (``synthetic-fundus`` itself for 6 sites)."""
        dataset = "synthetic-fundus" if sites == BASE_SITES else f"synthetic-fundus-{sites}"
        return {**self.overrides, "num-server-rounds": self.rounds, "data-scale": self.data_scale,
                "image-size": image_size, "dataset": dataset}

    def configurations(self) -> list[tuple[int, int]]:
        """``(sites, image size)`` of every ``flwr run`` the parts need, each once."""
        base = (BASE_SITES, self.sizes[0])
        needed: list[tuple[int, int]] = []
        if "wire" in self.parts or "overhead" in self.parts:
            needed.append(base)
        if "memory" in self.parts or "scaling" in self.parts:
            needed += [(sites, self.sizes[0]) for sites in self.sites]
        if "scaling" in self.parts:
            needed += [(BASE_SITES, size) for size in self.sizes]
        return list(dict.fromkeys(needed))


def _label(sites: int, image_size: int) -> str:
    return f"sites{sites}-px{image_size}"


class Bench:
    """Runs a :class:`Plan`, keeps the results and writes them after every step."""

    def __init__(self, plan: Plan, out: Path) -> None:
        self.plan, self.out = plan, out
        self.started = time.monotonic()
        self.results: dict[str, object] = {"settings": plan.settings(BASE_SITES, plan.sizes[0]),
                                           "parts": list(plan.parts), "runs": {}}
        self.environment = flwr_environment()

    def progress(self, text: str) -> None:
        """Print one progress line with the time since the start."""
        print(f"[bench {time.monotonic() - self.started:5.0f} s] {text}", flush=True)

    def save(self) -> None:
        """Write ``results.json`` and ``report.md``."""
        self.results["wall-seconds"] = time.monotonic() - self.started
        (self.out / "results.json").write_text(json.dumps(self.results, indent=2, default=str))
        write_report(self.out / "report.md", self.results)

    def flwr_runs(self) -> dict[str, dict[str, object]]:
        """Every configuration of the plan through ``flwr run``."""
        runs = self.results["runs"]
        for sites, size in self.plan.configurations():
            label = _label(sites, size)
            self.progress(f"flwr run {label} ({self.plan.rounds} rounds)")
            runs[label] = run_flwr(self.plan.settings(sites, size), self.out, label, self.environment)
            self.progress(f"{label}: {runs[label]['wall-seconds']:.0f} s, rounds "
                          f"{[round(s, 1) for s in runs[label]['round-seconds']]} s, "
                          f"peak {runs[label]['peak-rss-gib']:.2f} GiB")
            self.save()
        return runs

    def run(self) -> str:
        """All parts of the plan; returns the report."""
        self.out.mkdir(parents=True, exist_ok=True)
        runs = self.flwr_runs()
        plan, base = self.plan, runs.get(_label(BASE_SITES, self.plan.sizes[0]))
        if "wire" in plan.parts:
            settings = plan.settings(BASE_SITES, plan.sizes[0])
            self.results["wire"] = {"sizes": model_bytes(settings), "traffic": base["traffic"],
                                    "eval-every": RunConfig.from_mapping(settings).eval_every}
        if "overhead" in plan.parts:
            self.progress("in-process loop (same settings as the 6-site flwr run)")
            local = run_in_process(RunConfig.from_mapping(plan.settings(BASE_SITES, plan.sizes[0])), self.progress)
            self.results["overhead"] = {"flwr": base, "in-process": local}
        if "memory" in plan.parts:
            self.results["memory"] = [runs[_label(s, plan.sizes[0])] for s in plan.sites]
            self.results["memory-breakdown"] = self.memory_breakdown(runs)
        if "scaling" in plan.parts:
            labels = {_label(s, plan.sizes[0]) for s in plan.sites} | {_label(BASE_SITES, p) for p in plan.sizes}
            self.results["scaling"] = [runs[label] for label in sorted(labels)]
        if "gpu" in plan.parts:
            self.results["gpu"] = self.gpu()
        self.save()
        return (self.out / "report.md").read_text()

    def memory_breakdown(self, runs: dict[str, dict[str, object]]) -> dict[str, object]:
        """Which run's peak the report breaks down by process (the 6-site one when run), and the import cost."""
        base = _label(BASE_SITES, self.plan.sizes[0])
        label = base if base in runs else _label(self.plan.sites[-1], self.plan.sizes[0])
        self.progress("import cost of a fresh ClientApp process")
        return {"run": label, "import-cost": import_cost(ROOT)}

    def gpu(self) -> dict[str, object]:
        """The in-process loop on the GPU at 256 px, or why it was skipped."""
        if not torch.cuda.is_available():
            self.progress("no CUDA GPU: GPU part skipped")
            return {"skipped": "torch.cuda.is_available() is False on this machine (no CUDA GPU)"}
        settings = {**self.plan.settings(BASE_SITES, GPU_IMAGE_SIZE), "device": "cuda"}
        self.progress(f"in-process loop on {torch.cuda.get_device_name(0)} at {GPU_IMAGE_SIZE} px")
        result = run_in_process(RunConfig.from_mapping(settings), self.progress)
        return {**result, "device": torch.cuda.get_device_name(0), "image-size": GPU_IMAGE_SIZE,
                "sites": BASE_SITES}


def parse_plan(argv: list[str] | None) -> tuple[Plan, Path]:
    """The plan and output folder from the command line (``--quick`` replaces rounds, scale, sites, sizes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results") / "bench")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data-scale", type=float, default=0.5)
    parser.add_argument("--sites", nargs="+", type=int, default=[2, 4, 6, 12, 24])
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 96, 128])
    parser.add_argument("--quick", action="store_true",
                        help="a check that it works: 2 rounds, data-scale 0.25, sites 2 and 6, 64 px")
    parser.add_argument("--run-config", default="", help='extra run-config keys, e.g. "max-local-steps=4"')
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.data_scale, args.sites, args.sizes = 2, 0.25, [2, 6], [64]
    plan = Plan(tuple(args.parts), args.rounds, args.data_scale, tuple(args.sites), tuple(args.sizes),
                parse_overrides(args.run_config))
    for sites in plan.sites:  # fail on a bad setting before any run
        RunConfig.from_mapping(plan.settings(sites, plan.sizes[0]))
    for size in plan.sizes:
        RunConfig.from_mapping(plan.settings(BASE_SITES, size))
    return plan, args.out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    plan, out = parse_plan(argv)
    report = Bench(plan, out).run()
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
