"""A small synthetic run folder for the report tests: two sites, two validation rounds, a test round."""

from __future__ import annotations

import csv
from pathlib import Path

SITES = ("site-1", "site-2")


def metric_rows(with_test: bool = True) -> list[tuple]:
    """``(round, split, site, metric, value)`` rows with hand-picked values."""
    rows: list[tuple] = []
    for server_round, base in ((1, 0.5), (2, 0.7)):
        for offset, site in enumerate((*SITES, "pooled")):
            for name, shift in (("dice-global", 0.0), ("dice-personal", 0.05), ("dice-super", 0.1)):
                rows.append((server_round, "val", site, name, base + shift + 0.01 * offset))
            rows.append((server_round, "val", site, "num-images", 4.0))
    if with_test:
        test = {
            # site-1: 3 images to its own model (Dice 0.8), 1 to the global model (Dice 0.6)
            "site-1": {"dice-global": 0.6, "dice-super": 0.75, "num-images": 4.0, "gamma": 0.3,
                       "num-routed-0": 3.0, "routed-dice-0": 0.8, "num-routed-global": 1.0, "routed-dice-global": 0.6},
            # site-2: 1 image misrouted to site-1's model, 2 to its own; no foreground in the misrouted one
            "site-2": {"dice-global": 0.5, "dice-super": 0.55, "num-images": 3.0, "gamma": 0.3,
                       "num-routed-0": 1.0, "num-routed-1": 2.0, "routed-dice-1": 0.55},
            "pooled": {"dice-global": 0.557, "dice-super": 0.664, "num-images": 7.0},
        }
        rows += [(2, "test", site, name, value) for site, values in test.items() for name, value in values.items()]
    return rows


def write_csv(path: Path, header: tuple[str, ...], rows: list[tuple]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def write_run_folder(folder: Path, with_test: bool = True) -> Path:
    """metrics.csv, traffic.csv, timing.csv and summary.md of a two-round run of two sites."""
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / "metrics.csv", ("round", "split", "site", "metric", "value"), metric_rows(with_test))
    traffic = [(r, stage, site, direction, 1_000_000 * r, 900_000 * r)
               for r in (1, 2) for stage in ("train", "evaluate") for site in SITES
               for direction in ("sent", "received")]
    write_csv(folder / "traffic.csv", ("round", "stage", "site", "direction", "bytes", "array-bytes"), traffic)
    timing = [(0, "setup", 3.0, 0.0), (1, "train", 4.0, 0.0), (1, "round", 5.0, 0.0), (2, "round", 7.5, 0.0),
              (0, "server-app", 20.0, 0.0)]
    write_csv(folder / "timing.csv", ("round", "part", "seconds", "ended"), timing)
    (folder / "summary.md").write_text("# FedSM on synthetic-fundus, 2 rounds\n\n## Settings\n\n| key | value |\n"
                                       "|---|---|\n| strategy | fedsm |\n| dataset | synthetic-fundus |\n"
                                       "| num-server-rounds | 2 |\n\n## Test\n\n| site | images |\n|---|---|\n"
                                       "| pooled | 7 |\n")
    return folder
