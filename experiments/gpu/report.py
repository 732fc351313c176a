"""``report.md`` of :mod:`experiments.gpu.check`: GPU tests, the 256 px simulation, CPU-vs-GPU agreement."""

from __future__ import annotations

from pathlib import Path
from statistics import mean

BUSY_TARGET = 0.60  # six sites at 256 px should keep one H100/H200-class GPU this busy while training


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{value:.1f}" for value in values) if values else "-"


def environment_section(results: dict) -> list[str]:
    """Machine, torch and CUDA versions."""
    env = results.get("environment", {})
    return ["## Machine", "",
            f"- GPUs: {', '.join(env.get('gpus', [])) or '-'}",
            f"- torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, cuDNN {env.get('cudnn', '?')}",
            f"- command: `{results.get('command', '?')}`", ""]


def tests_section(tests: dict) -> list[str]:
    """The ``gpu``-marked tests: pytest's status and summary line."""
    if not tests:
        return ["## Tests marked `gpu`", "", "Not run.", ""]
    verdict = "passed" if tests.get("status") == 0 else f"FAILED (pytest exit status {tests.get('status')})"
    return ["## Tests marked `gpu`", "", f"`python -m pytest -q -m gpu`: {verdict}; {tests.get('summary', '')}", ""]


def simulation_section(simulation: dict) -> list[str]:
    """Seconds per round, images per second, busy share during training, peak GPU memory per process."""
    lines = ["## Simulation: 6 sites, 256 px, 3 rounds (`scripts/run-simulation.sh`, CLIENT_GPUS=auto)", ""]
    if "error" in simulation:
        return [*lines, f"Failed: {simulation['error']}", ""]
    busy = simulation.get("busy-share", {})
    overall = mean(busy.values()) if busy else float("nan")
    verdict = ("no sample fell inside a training exchange" if not busy else
               f"{'meets' if overall >= BUSY_TARGET else 'BELOW'} the {BUSY_TARGET:.0%} target")
    images = simulation.get("train-images-per-round", 0)
    rates = [images / seconds for seconds in simulation.get("train-seconds", []) if seconds > 0]
    lines += [
        f"- run config: `{simulation.get('overrides', '')}`; GPU share per client: "
        f"{simulation.get('client-gpu-share', '?')}",
        f"- seconds per round: {_seconds(simulation.get('round-seconds', []))} "
        f"(training exchange: {_seconds(simulation.get('train-seconds', []))})",
        f"- training images per round: {images}; images per second in the training exchange: "
        f"{', '.join(f'{rate:.1f}' for rate in rates) or '-'}",
        "- GPU busy share during training exchanges: "
        + (", ".join(f"GPU {gpu} {share:.0%}" for gpu, share in busy.items()) or "-")
        + f"; mean {overall:.0%}: {verdict}",
        f"- nvidia-smi samples: {simulation.get('samples', 0)}; wall time {simulation.get('wall-seconds', 0):.0f} s",
        "",
        "| process | peak GPU memory (MiB) |",
        "|---|---|",
    ]
    peaks = simulation.get("peak-memory-mib", {})
    lines += [f"| {name} | {mib:.0f} |" for name, mib in peaks.items()] or ["| (no process listed by nvidia-smi) | - |"]
    return [*lines, ""]


def agreement_section(agreement: dict) -> list[str]:
    """One FedSM round on CPU and GPU: relative update difference per model against the tolerance."""
    lines = ["## One FedSM round on CPU and GPU, same seeds, fp32", ""]
    if "error" in agreement:
        return [*lines, f"Failed: {agreement['error']}", ""]
    tolerance = agreement.get("tolerance", float("nan"))
    models = agreement.get("models", [])
    verdict = "all models agree" if models and all(m["agrees"] for m in models) else "DISAGREE"
    floor = agreement.get("floor", float("nan"))
    lines += [f"Settings `{agreement.get('settings', {})}`. Summation-order floor (CPU on 1 thread against all "
              f"cores, largest relative difference over the models): {floor:.2e}. Tolerance: "
              f"||update_gpu - update_cpu|| <= {tolerance:.3g} * ||update_cpu|| per model (the larger of 1 % and "
              f"twice the floor): {verdict}.", "",
              "| model | ||update_cpu|| | relative difference | max abs difference | within |",
              "|---|---|---|---|---|"]
    lines += [f"| {m['model']} | {m['update-norm']:.4g} | {m['relative']:.2e} | {m['max-abs']:.2e} | "
              f"{'yes' if m['agrees'] else 'NO'} |" for m in models]
    return [*lines, ""]


def format_report(results: dict) -> str:
    """The whole report as Markdown."""
    lines = ["# GPU check", "", *environment_section(results), *tests_section(results.get("tests", {})),
             *simulation_section(results.get("simulation", {"error": "not run"})),
             *agreement_section(results.get("agreement", {"error": "not run"}))]
    return "\n".join(lines)


def write_report(path: Path, results: dict) -> None:
    """Write :func:`format_report` of ``results`` to ``path``."""
    Path(path).write_text(format_report(results))
