"""How soon the final fine-tuning reaches pooled training: the pooling, the cheapest stop, training and resume."""

from __future__ import annotations

import csv

import pytest

from experiments.ladder import fine_tuning_speed as speed
from experiments.ladder import run_ladder as ladder
from experiments.runner import read_rows

TINY = {"image-size": 32, "data-scale": 0.1, "max-local-steps": 2, "selector-width": 4, "batch-size": 4,
        "eval-every": 1, "aggregation": "mean"}
TINY_TEXT = " ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}" for key, value in TINY.items())


def test_a_budget_of_passes_keeps_each_sites_best_pass_up_to_it_weighted_by_its_images():
    sites = {"a": (1, [0.50, 0.70, 0.60]), "b": (3, [0.80, 0.75, 0.90])}
    assert speed.pooled_after(sites, 0) == pytest.approx((0.50 + 3 * 0.80) / 4)
    assert speed.pooled_after(sites, 1) == pytest.approx((0.70 + 3 * 0.80) / 4)  # b's pass 1 is worse: b keeps 0
    assert speed.pooled_after(sites, 2) == pytest.approx((0.70 + 3 * 0.90) / 4)


def test_the_soonest_stop_is_the_cheapest_rounds_plus_passes_that_reach_the_target():
    curves = {10: {"a": (1, [0.80, 0.85, 0.91])},   # reaches 0.90 at 10 + 2 = 12
              5: {"a": (1, [0.70, 0.92, 0.93])},    # at 5 + 1 = 6: the soonest
              20: {"a": (1, [0.95, 0.95, 0.95])}}   # at 20 + 0
    assert speed.soonest(curves, 0.90) == (5, 1, 0.92)
    assert speed.soonest(curves, 0.96) is None


def _study_csv(path, peak: float) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["dataset", "method", "seed", "run", "kind", "round", "site", "image", "value"])
        writer.writerows(["synthetic-fundus", "centralized", "0", "x", "val", r, "pooled", "", v]
                         for r, v in ((1, 0.2), (2, peak)))


@pytest.mark.usefixtures("client_process")
def test_fine_tuning_starts_from_the_ladders_global_model_and_a_resumed_seed_ends_as_a_whole_one(tmp_path,
                                                                                                monkeypatch):
    # Prepare
    _study_csv(tmp_path / "study.csv", 0.5)
    common = ["--dataset", "synthetic-fundus", "--max-passes", "2", "--run-config", TINY_TEXT,
              "--study-csv", str(tmp_path / "study.csv")]

    # Execute: uninterrupted; then stop 1 alone, and the same folder continued to stop 2
    assert speed.main(["--out", str(tmp_path / "whole"), "--stops", "1", "2", *common]) == 0
    assert speed.main(["--out", str(tmp_path / "parts"), "--stops", "1", *common]) == 0
    assert speed.main(["--out", str(tmp_path / "parts"), "--stops", "1", "2", *common]) == 0
    monkeypatch.setattr(speed, "fine_tuning_rows", lambda *a: pytest.fail("a finished stop was fine-tuned again"))
    assert speed.main(["--out", str(tmp_path / "parts"), "--stops", "1", "2", *common]) == 0

    # Assert: six sites, passes 0-2, at each stop; the resumed run wrote the same rows
    whole = read_rows(tmp_path / "whole" / "curves.csv")
    assert len(whole) == 2 * 6 * 3
    assert read_rows(tmp_path / "parts" / "curves.csv") == whole
    # pass 0 is the global model: pooled over the sites, it is the ladder's FedAvg validation Dice of that round
    # (the ladder keeps the input-norm it was measured with unless told; here both train with today's default)
    settings = {**TINY, "input-norm": "per-image"}
    cell = ladder.run_cell(ladder.cell_config("synthetic-fundus", 0, 2, settings, "fedavg"), "fedavg", "real",
                           tmp_path / "cell")
    curves = speed.read_curves(whole, "synthetic-fundus", "0")
    assert [round(speed.pooled_after(curves[r], 0), 6) for r in (1, 2)] == pytest.approx(
        [dice for _, dice in cell.curves["global"]], abs=2e-6)
    table = (tmp_path / "whole" / "table.md").read_text()
    assert "### synthetic-fundus, seed 0" in table and "Target 0.4900" in table and "| 2 | " in table
