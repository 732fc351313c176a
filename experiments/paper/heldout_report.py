"""Tables and figures of the held-out-site study (``experiments.paper.heldout``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedsm_core.analysis.held_out import HeldOutResult, project_2d  # noqa: E402

KINDS = ("zero", "bundle", "calibrated", "local", "oracle")
KIND_LABELS = {"zero": "gamma = 0", "bundle": "run's gamma", "calibrated": "calibrated", "local": "local (own val)",
               "oracle": "oracle (test)"}


def result_rows(result: HeldOutResult) -> list[dict[str, object]]:
    """Long-format rows: gammas, temperature, selection frequencies and Dice."""
    rows = [{"quantity": "gamma", "key": f"{kind}-{model}" if isinstance(value, tuple) else kind, "value": g}
            for kind, value in result.gammas.items()
            for model, g in (enumerate(value) if isinstance(value, tuple) else [(0, value)])]
    rows.append({"quantity": "temperature", "key": "selector", "value": result.temperature})
    rows.append({"quantity": "images", "key": "test", "value": result.num_images})
    for kind, shares in result.frequencies.items():
        rows += [{"quantity": f"share@{kind}", "key": model, "value": share} for model, share in shares.items()]
    rows += [{"quantity": "dice", "key": key, "value": value} for key, value in result.dice.items()]
    rows += [{"quantity": "dice-vs-gamma", "key": f"{g:.2f}", "value": v}
             for g, v in zip(result.gamma_grid, result.curve, strict=True)]
    return [{"held-out-site": result.site, **row} for row in rows]


def result_table(results: Sequence[HeldOutResult]) -> list[str]:
    """Markdown: selection frequencies (Table 5 layout), then Dice per gamma choice."""
    models = ["global"]  # every run's training sites (each run lacks its held-out one), in site order
    for r in results:
        previous = "global"
        for key in r.frequencies["zero"]:
            if key not in models:
                models.insert(models.index(previous) + 1, key)
            previous = key
    lines = ["Share of test images routed to each model", "",
             "| held-out site | gamma | " + " | ".join(models) + " |", "|---" * (len(models) + 2) + "|"]
    for r in results:
        for kind in [k for k in ("zero", "calibrated", "local") if k in r.frequencies]:
            shares = r.frequencies[kind]
            cells = [f"{shares[m]:.2f}" if m in shares else "-" for m in models]
            lines.append(f"| {r.site} | {kind} {_gamma(r.gammas[kind])} | " + " | ".join(cells) + " |")
    lines += ["", "Dice on the held-out site's test images", "",
              "| held-out site | images | global | best personalized | " + " | ".join(KIND_LABELS[k] for k in KINDS)
              + " | gammas (run / calibrated / local / oracle) | T |", "|---" * 11 + "|"]
    for r in results:
        personal = {k: v for k, v in r.dice.items() if k != "global" and not k.startswith("super@")}
        best = max(personal, key=personal.get)
        cells = [f"{r.dice[f'super@{k}']:.4f}" if f"super@{k}" in r.dice else "-" for k in KINDS]
        local = f"{r.gammas['local']:.2f}" if "local" in r.gammas else "-"
        lines.append(f"| {r.site} | {r.num_images} | {r.dice['global']:.4f} | {personal[best]:.4f} ({best}) | "
                     + " | ".join(cells) + f" | {_gamma(r.gammas['bundle'])} / {r.gammas['calibrated']:.2f} / "
                     f"{local} / {r.gammas['oracle']:.2f} | {r.temperature:.2f} |")
    return lines


def plot_gamma_curves(path: Path, results: Sequence[HeldOutResult]) -> Path:
    """Super-model Dice versus gamma per held-out site; the calibrated gamma marked."""
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for r in results:
        line, = axis.plot(r.gamma_grid, r.curve, label=r.site)
        calibrated = r.gammas["calibrated"]
        axis.plot([calibrated], [np.interp(calibrated, r.gamma_grid, r.curve)], "o", color=line.get_color())
    axis.set_xlabel("gamma")
    axis.set_ylabel("super-model Dice, held-out test")
    axis.set_title("Held-out sites: Dice vs gamma (dots: calibrated gamma)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def plot_features(path: Path, features: Mapping[str, Mapping[str, np.ndarray]], held_out: Sequence[str]) -> Path:
    """One panel per held-out run: PCA of selector features of every site's test images."""
    runs = list(held_out)
    figure, axes = plt.subplots(1, len(runs), figsize=(4.5 * len(runs), 4.2), squeeze=False)
    for axis, run in zip(axes[0], runs, strict=True):
        per_site = features[run]
        points = project_2d(np.concatenate(list(per_site.values())))
        start = 0
        for name, array in per_site.items():
            part = points[start:start + len(array)]
            start += len(array)
            axis.scatter(part[:, 0], part[:, 1], s=10 if name != run else 28,
                         marker="x" if name == run else "o", label=name + (" (held out)" if name == run else ""))
        axis.set_title(f"selector features, trained without {run}", fontsize=9)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _gamma(gamma: float | tuple[float, ...]) -> str:
    """``0.50``, or ``per model (0.00-1.00)`` for a run that chose one gamma per personalized model."""
    if isinstance(gamma, tuple):
        return f"per model ({min(gamma):.2f}-{max(gamma):.2f})"
    return f"{gamma:.2f}"
