"""The Markdown report of :mod:`experiments.bench.run_bench`, from its results dictionary.

Every section takes plain numbers (the JSON the benchmark writes), so the
report can be rebuilt from ``results.json`` and tested on hand-made values.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import mean

from experiments.bench.plot import SCALING_PLOT, write_scaling_plot
from experiments.bench.process_memory import CLIENT_APP, ROLES, SERVER_APP

MB = 1e6
MIB = 2**20
# Issue 19: a round through ``flwr run`` at most this many times the in-process training per round / workers.
ROUND_TIME_TARGET = 1.25


def _mb(value: float) -> str:
    return f"{value / MB:.2f}"


def _seconds(values: Sequence[float]) -> float:
    return mean(values) if values else math.nan


def expected_bytes(sizes: Mapping[str, int]) -> dict[str, float]:
    """Bytes per site and message of each accounting, from one U-Net (``model``), ``selector``, ``moments``, K.

    ``paper``: 2 U-Nets (global, own personalized) + selector, each way;
    ``app``: the same plus the selector's Adam moments, as this app sends
    them (after round 1 on the way down); ``all-personalized``: the global
    model, all K personalized models, the selector and its moments;
    ``super-model``: what an evaluation message carries (global + K personalized + selector).
    """
    model, selector, moments, sites = sizes["model"], sizes["selector"], sizes["moments"], sizes["sites"]
    return {
        "paper": 2 * model + selector,
        "app": 2 * model + selector + moments,
        "all-personalized": (sites + 1) * model + selector + moments,
        "super-model": (sites + 1) * model + selector,
    }


def _measured(traffic: Mapping[str, Mapping[str, float]], key: str) -> float:
    return traffic[key]["array-bytes"] if key in traffic else math.nan


def _later_rounds(traffic: Mapping[str, Mapping[str, float]], key: str) -> float:
    values = [v["array-bytes"] for k, v in traffic.items() if k.startswith(f"{key}/round-") and k != f"{key}/round-1"]
    return mean(values) if values else math.nan


def wire_section(sizes: Mapping[str, int], traffic: Mapping[str, Mapping[str, float]], eval_every: int) -> list[str]:
    """Measured model bytes per site and message next to the paper's and other accountings (MB)."""
    expected = expected_bytes(sizes)
    k = sizes["sites"]
    rows = [
        ("measured: training, round 1 (no Adam moments yet)", _measured(traffic, "train/sent/round-1"),
         _measured(traffic, "train/received/round-1")),
        ("measured: training, rounds 2+", _later_rounds(traffic, "train/sent"),
         _later_rounds(traffic, "train/received")),
        ("selector-moments = averaged: 2 U-Nets + selector + its Adam moments", expected["app"], expected["app"]),
        ("paper: 2 U-Nets (global, own personalized) + selector", expected["paper"], expected["paper"]),
        (f"sending all K = {k} personalized models (+ global, selector, moments)", expected["all-personalized"],
         expected["app"]),
        ("measured: evaluation (validation), per evaluated round", _measured(traffic, "evaluate/sent"),
         _measured(traffic, "evaluate/received")),
        ("measured: final test evaluation", _measured(traffic, "test/sent"), _measured(traffic, "test/received")),
        ("measured: needed-models query, per evaluation", _measured(traffic, "needed-models/sent"),
         _measured(traffic, "needed-models/received")),
        (f"super model (global + {k} personalized + selector)", expected["super-model"], 0.0),
    ]
    train_round = (_measured(traffic, "train/sent") + _measured(traffic, "train/received")) * k
    evaluate_round = (_measured(traffic, "evaluate/sent") + _measured(traffic, "evaluate/received")) * k
    lines = ["## Bytes on the wire per site and message", "",
             (f"Array payload in MB (1 MB = 10^6 bytes) per site; one U-Net = {_mb(sizes['model'])} MB, "
              f"selector = {_mb(sizes['selector'])} MB, its Adam moments = {_mb(sizes['moments'])} MB; K = {k}."),
             "", "| | server -> site | site -> server | vs paper (down) |", "|---|---|---|---|"]
    lines += [f"| {name} | {_mb(down)} | {_mb(up)} | {down / expected['paper']:.2f}x |" for name, down, up in rows]
    lines += ["", (f"All {k} sites together: training {_mb(train_round)} MB per round; a validation round adds "
                   f"{_mb(evaluate_round)} MB ({evaluate_round / train_round:.2f}x the training traffic; validation "
                   f"every {eval_every} round(s)). An evaluation sends each site the global model, the selector and "
                   "only the personalized models its images can be routed to, which the site names first in a "
                   "needed-models query (its own row). Config and metric records add "
                   f"{_config_bytes(traffic):.0f} bytes or less per message.")]
    return lines


def _config_bytes(traffic: Mapping[str, Mapping[str, float]]) -> float:
    return max((v["bytes"] - v["array-bytes"] for v in traffic.values()), default=0.0)


def round_time_ratio(flwr_mean_round: float, local_train_per_round: float, workers: int) -> float:
    """``flwr run``'s mean round over the in-process loop's training compute per round shared by ``workers``.

    The in-process loop trains the sites one after another in one process;
    ``workers`` Ray workers can at best split that compute between them, so
    ``local_train_per_round / workers`` is the round time with no framework
    cost at all. Issue 19's target is a ratio of at most :data:`ROUND_TIME_TARGET`.
    """
    if workers < 1:
        raise ValueError(f"workers = {workers}: a run trains on at least one Ray worker")
    return flwr_mean_round / (local_train_per_round / workers)


def _ratio_lines(flwr: Mapping[str, object], local: Mapping[str, object]) -> tuple[str, str]:
    """The ratio row of the overhead table and the sentence that says whether the target is met."""
    workers = flwr["workers"]
    flwr_round, local_train = _seconds(flwr["round-seconds"]), _seconds(local["train-seconds"])
    ratio = round_time_ratio(flwr_round, local_train, workers)
    row = (f"| **round-time ratio**: mean round / (in-process training per round / {workers} workers), "
           f"target <= {ROUND_TIME_TARGET:.2f}x | {flwr_round:.1f} | {local_train / workers:.1f} | "
           f"**{ratio:.2f}x** |")
    verdict = "met" if ratio <= ROUND_TIME_TARGET else "not met"
    sentence = (f"Round-time ratio {ratio:.2f}x against the target of {ROUND_TIME_TARGET:.2f}x ({verdict}): "
                f"a round through `flwr run` takes {flwr_round:.1f} s; the in-process loop trains a round in "
                f"{local_train:.1f} s, which {workers} Ray ClientApp workers could at best share "
                f"({local_train / workers:.1f} s).")
    return row, sentence


def largest_first_makespan(seconds: Sequence[float], workers: int) -> float:
    """How long ``workers`` take for jobs of ``seconds`` handed out largest first, each to the first free worker."""
    if workers < 1:
        raise ValueError(f"workers = {workers}: a run trains on at least one Ray worker")
    free = [0.0] * workers
    for job in sorted(seconds, reverse=True):
        heapq.heapreplace(free, free[0] + job)  # free[0]: the worker that is free first (a min-heap)
    return max(free)


def _schedule_lines(flwr: Mapping[str, object], local: Mapping[str, object]) -> list[str]:
    """Where a training exchange goes: the sites' own time, and the rest (transfer, queueing)."""
    per_round = flwr.get("site-seconds") or []
    if not per_round or "workers" not in flwr:
        return []
    workers = flwr["workers"]
    summed = _seconds([sum(r) for r in per_round])
    best = _seconds([largest_first_makespan(r, workers) for r in per_round])
    exchange = _seconds(flwr["train-seconds"])
    return ["", f"Inside the training exchange, mean per round (the sites report their own time on a training "
                f"message; {workers} workers):", "",
            "| | seconds |", "|---|---|",
            f"| in-process training | {_seconds(local['train-seconds']):.1f} |",
            f"| the sites' own time, summed | {summed:.1f} |",
            f"| those times on {workers} workers, largest first (no transfer, no waiting) | {best:.1f} |",
            f"| measured training exchange | {exchange:.1f} |",
            f"| rest: transfer, decoding, queueing | {exchange - best:.1f} |"]


def overhead_section(flwr: Mapping[str, object], local: Mapping[str, object]) -> list[str]:
    """Wall time of the same training through ``flwr run`` and as a plain loop in one process."""
    rounds_f, rounds_l = flwr["round-seconds"], local["round-seconds"]
    rows = [("total wall time", flwr["wall-seconds"], local["total-seconds"]),
            ("sum of rounds", sum(rounds_f), sum(rounds_l)),
            ("mean round", _seconds(rounds_f), _seconds(rounds_l)),
            *[(f"round {i + 1}", f, p) for i, (f, p) in enumerate(zip(rounds_f, rounds_l, strict=True))],
            ("training exchange / training, mean per round", _seconds(flwr["train-seconds"]),
             _seconds(local["train-seconds"])),
            ("start-up: total minus rounds (flwr) / data and models (in-process)", flwr["start-up-seconds"],
             local["setup-seconds"]),
            ("  of which the ServerApp's own setup (site discovery, models)", flwr["setup-seconds"], math.nan),
            ("final test evaluation", flwr["test-seconds"], local["test-seconds"])]
    lines = ["## Framework overhead", "", "Same data, rounds, batches and seeds; seconds.", "",
             "| | flwr run | in-process | ratio |", "|---|---|---|---|"]
    lines += [f"| {name} | {f:.1f} | - | - |" if math.isnan(p) else f"| {name} | {f:.1f} | {p:.1f} | {f / p:.2f} |"
              for name, f, p in rows]
    ratio = _ratio_lines(flwr, local) if "workers" in flwr else None  # results of an older benchmark lack it
    if ratio:
        lines += [ratio[0], "", ratio[1]]
    lines += _schedule_lines(flwr, local)
    lines += ["", (f"Pooled test Dice of the super model: flwr run {flwr['test-dice-super']:.4f}, "
                   f"in-process {local['test-dice-super']:.4f}. Peak memory: flwr run {flwr['peak-rss-gib']:.2f} GiB "
                   f"(all its processes), in-process {local['max-rss-gib']:.2f} GiB (max RSS of the benchmark "
                   "process).")]
    return lines


def memory_section(runs: Sequence[Mapping[str, object]]) -> list[str]:
    """Peak summed RSS and time per round by number of sites."""
    lines = ["## Peak memory by number of sites", "",
             ("| sites | image size | peak RSS, all processes (GiB) | PSS at that peak (GiB) | processes at peak "
              "| mean round (s) | wall (s) |"),
             "|---|---|---|---|---|---|---|"]
    for run in sorted(runs, key=lambda r: r["sites"]):
        lines.append(f"| {run['sites']} | {run['settings']['image-size']} | {run['peak-rss-gib']:.2f} | "
                     f"{run.get('peak-pss-gib', math.nan):.2f} | {run['processes-at-peak']} | "
                     f"{_seconds(run['round-seconds']):.1f} | {run['wall-seconds']:.0f} |")
    return lines


def memory_by_role(processes: Sequence[Mapping[str, object]]) -> list[tuple[str, int, float, float, float]]:
    """``(role, processes, RSS, PSS, anonymous)`` in MiB per role present, in the order of :data:`ROLES`."""
    rows = []
    for role in ROLES:
        chosen = [p for p in processes if p["role"] == role]
        if chosen:
            rows.append((role, len(chosen), *(sum(p[key] for p in chosen) / MIB for key in ("rss", "pss", "anon"))))
    return rows


def role_section(run: Mapping[str, object], import_steps: Sequence[Mapping[str, object]]) -> list[str]:
    """Memory at the peak of ``run`` by process role, and what importing the ClientApp costs a process."""
    rows = memory_by_role(run["memory-at-peak"])
    lines = ["## Memory at the peak by process role", "",
             (f"The {run['sites']}-site run at {run['settings']['image-size']} px, at the sample with the largest "
              "summed RSS; MiB. RSS counts a shared library's pages once in every process that maps it; PSS "
              "splits them between those processes, so the PSS sum is the memory the run really occupies; "
              "anonymous memory (heap, tensors, decoded messages, allocator arenas) is each process's own."),
             "", "| role | processes | RSS (MiB) | PSS (MiB) | anonymous (MiB) |", "|---|---|---|---|---|"]
    lines += [f"| {role} | {n} | {rss:.0f} | {pss:.0f} | {anon:.0f} |" for role, n, rss, pss, anon in rows]
    totals = [sum(row[i] for row in rows) for i in range(1, 5)]
    lines.append(f"| all | {totals[0]} | {totals[1]:.0f} | {totals[2]:.0f} | {totals[3]:.0f} |")
    lines += ["", (f"Summed over all {run['processes-at-peak']} processes at the peak: RSS "
                   f"{run['peak-rss-gib'] * 1024:.0f} MiB (the headline figure), PSS {totals[2]:.0f} MiB.")]
    return lines + [""] + import_cost_lines(import_steps, rows)


def import_cost_lines(steps: Sequence[Mapping[str, object]], rows: Sequence[tuple]) -> list[str]:
    """What a fresh process holds after each import step, and that cost times the processes that pay it."""
    lines = ["Import cost per process: a fresh `python -c \"import client_app.app\"`, "
             "read from /proc/self/smaps_rollup after each import (each step adds to the one before); MiB.", "",
             "| after importing | RSS | PSS | anonymous | RSS added |", "|---|---|---|---|---|"]
    previous = 0
    for step in steps:
        lines.append(f"| {step['step']} | {step['rss'] / MIB:.0f} | {step['pss'] / MIB:.0f} | "
                     f"{step['anon'] / MIB:.0f} | {(step['rss'] - previous) / MIB:+.0f} |")
        previous = step["rss"]
    last = steps[-1]
    paying = sum(n for role, n, *_ in rows if role in (SERVER_APP, CLIENT_APP))
    lines += ["", (f"torch, torchvision and segmentation_models_pytorch with the app's own modules cost each "
                   f"process {last['rss'] / MIB:.0f} MiB RSS ({last['anon'] / MIB:.0f} MiB anonymous) before it "
                   f"holds a model or an image. The {paying} processes that import them (the ServerApp and the "
                   f"ClientApp workers) hold {paying * last['rss'] / MIB:.0f} MiB of the summed RSS for that alone, "
                   f"{paying * last['anon'] / MIB:.0f} MiB of it anonymous, which no sharing removes.")]
    return lines


def scaling_section(runs: Sequence[Mapping[str, object]]) -> list[str]:
    """Time per round as sites and image size grow."""
    lines = ["## Time per round by sites and image size", "",
             "| sites | image size | mean round (s) | training exchange (s) | per site (s) | peak RSS (GiB) |",
             "|---|---|---|---|---|---|"]
    for run in sorted(runs, key=lambda r: (r["settings"]["image-size"], r["sites"])):
        per_round = _seconds(run["round-seconds"])
        lines.append(f"| {run['sites']} | {run['settings']['image-size']} | {per_round:.1f} | "
                     f"{_seconds(run['train-seconds']):.1f} | {per_round / run['sites']:.2f} | "
                     f"{run['peak-rss-gib']:.2f} |")
    return lines


def gpu_section(gpu: Mapping[str, object]) -> list[str]:
    """GPU time per round and training images per second, or why the part was skipped."""
    lines = ["## GPU", ""]
    if "skipped" in gpu:
        return lines + [f"Skipped: {gpu['skipped']}."]
    images = sum(gpu["train-images"])
    lines += [f"{gpu['device']}, {gpu['image-size']} px, in-process loop, {gpu['sites']} sites.", "",
              "| round | round (s) | training (s) | training images | images / s |", "|---|---|---|---|---|"]
    for i, (r, t, n) in enumerate(zip(gpu["round-seconds"], gpu["train-seconds"], gpu["train-images"], strict=True)):
        lines.append(f"| {i + 1} | {r:.2f} | {t:.2f} | {n} | {n / t:.1f} |")
    lines += ["", (f"Overall {images / sum(gpu['train-seconds']):.1f} training images per second "
                   "(each image steps the global copy, the personalized model and the selector).")]
    return lines


def write_report(path: Path, results: Mapping[str, object]) -> str:
    """Write the sections present in ``results`` to ``path``; return the text."""
    lines = ["# FedSM benchmark", "", (f"Settings: {results['settings']}; wall time of the benchmark "
                                       f"{results.get('wall-seconds', math.nan):.0f} s."), ""]
    if "wire" in results:
        wire = results["wire"]
        lines += wire_section(wire["sizes"], wire["traffic"], wire["eval-every"]) + [""]
    if "overhead" in results:
        lines += overhead_section(results["overhead"]["flwr"], results["overhead"]["in-process"]) + [""]
    if "memory" in results:
        lines += memory_section(results["memory"]) + [""]
    if "memory-breakdown" in results:
        breakdown = results["memory-breakdown"]
        lines += role_section(results["runs"][breakdown["run"]], breakdown["import-cost"]) + [""]
    if "scaling" in results:
        write_scaling_plot(Path(path).parent / SCALING_PLOT, results["scaling"], results["settings"]["image-size"])
        lines += scaling_section(results["scaling"]) + ["", f"![Round time and peak memory by sites]({SCALING_PLOT})",
                                                        ""]
    if "gpu" in results:
        lines += gpu_section(results["gpu"]) + [""]
    text = "\n".join(lines)
    Path(path).write_text(text)
    return text
