"""Tables and figures of the held-out-site study from hand-made results."""

from __future__ import annotations

import numpy as np

from experiments.paper.heldout_report import plot_features, plot_gamma_curves, result_rows, result_table
from fedsm_core.analysis.held_out import HeldOutResult

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_result(site: str, trained_on: tuple[str, ...]) -> HeldOutResult:
    """Two training sites; shares and Dice chosen by hand."""
    first, second = trained_on
    return HeldOutResult(
        site=site,
        num_images=4,
        gamma_grid=(0.0, 0.5, 1.0),
        gammas={"zero": 0.0, "bundle": 0.6, "calibrated": 0.65, "oracle": 0.75},
        temperature=1.5,
        frequencies={
            "zero": {"global": 0.0, first: 0.5, second: 0.5},
            "bundle": {"global": 0.25, first: 0.25, second: 0.5},
            "calibrated": {"global": 0.5, first: 0.25, second: 0.25},
            "oracle": {"global": 0.75, first: 0.25, second: 0.0},
        },
        dice={"global": 0.55, first: 0.5, second: 0.275, "super@zero": 0.45, "super@bundle": 0.6,
              "super@calibrated": 0.575, "super@oracle": 0.65},
        curve=[0.45, 0.6, 0.55],
        calibration_curve=[0.6, 0.8, 0.5],
    )


def test_result_rows_hold_every_quantity_in_long_format():
    rows = result_rows(make_result("c", ("a", "b")))

    assert all(set(row) == {"held-out-site", "quantity", "key", "value"} for row in rows)
    assert all(row["held-out-site"] == "c" for row in rows)
    triples = [(row["quantity"], row["key"], row["value"]) for row in rows]
    for expected in [("gamma", "zero", 0.0), ("gamma", "bundle", 0.6), ("gamma", "calibrated", 0.65),
                     ("gamma", "oracle", 0.75), ("temperature", "selector", 1.5), ("images", "test", 4),
                     ("share@zero", "global", 0.0), ("share@zero", "a", 0.5), ("share@oracle", "global", 0.75),
                     ("share@calibrated", "b", 0.25), ("dice", "global", 0.55), ("dice", "b", 0.275),
                     ("dice", "super@oracle", 0.65), ("dice-vs-gamma", "0.00", 0.45),
                     ("dice-vs-gamma", "0.50", 0.6), ("dice-vs-gamma", "1.00", 0.55)]:
        assert expected in triples
    # 4 gammas + temperature + images + 4 kinds x 3 shares + 7 Dice + 3 curve points
    assert len(rows) == 4 + 1 + 1 + 12 + 7 + 3


def test_result_table_cells():
    lines = result_table([make_result("c", ("a", "b"))])

    assert "| held-out site | gamma | global | a | b |" in lines
    assert "| c | zero 0.00 | 0.00 | 0.50 | 0.50 |" in lines
    assert "| c | calibrated 0.65 | 0.50 | 0.25 | 0.25 |" in lines
    assert ("| c | 4 | 0.5500 | 0.5000 (a) | 0.4500 | 0.6000 | 0.5750 | - | 0.6500 | 0.60 / 0.65 / - / 0.75 | 1.50 |"
            in lines)
    header = next(line for line in lines if line.startswith("| held-out site | images"))
    assert header.count("|") - 1 == 11 and lines[lines.index(header) + 1] == "|---" * 11 + "|"


def test_result_table_of_several_held_out_sites_shows_every_training_site():
    # held out c (trained on a, b) and held out a (trained on b, c): the second run's share for c
    # must be shown, and the held-out site of each run is "-"
    lines = result_table([make_result("c", ("a", "b")), make_result("a", ("b", "c"))])

    assert "| held-out site | gamma | global | a | b | c |" in lines
    assert "| c | zero 0.00 | 0.00 | 0.50 | 0.50 | - |" in lines
    assert "| a | zero 0.00 | 0.00 | - | 0.50 | 0.50 |" in lines
    assert "| a | calibrated 0.65 | 0.50 | - | 0.25 | 0.25 |" in lines
    assert any(line.startswith("| a | 4 | 0.5500 | 0.5000 (b) |") for line in lines)


def test_result_table_columns_keep_site_order_when_every_site_is_held_out_in_turn():
    results = [make_result("s1", ("s2", "s3")), make_result("s2", ("s1", "s3")), make_result("s3", ("s1", "s2"))]

    lines = result_table(results)

    assert "| held-out site | gamma | global | s1 | s2 | s3 |" in lines
    assert "| s1 | zero 0.00 | 0.00 | - | 0.50 | 0.50 |" in lines
    assert "| s2 | zero 0.00 | 0.00 | 0.50 | - | 0.50 |" in lines
    assert "| s3 | zero 0.00 | 0.00 | 0.50 | 0.50 | - |" in lines


def test_result_table_of_no_results_has_only_headers():
    lines = result_table([])

    assert "| held-out site | gamma | global |" in lines
    assert lines[lines.index("| held-out site | gamma | global |") + 1] == "|---|---|---|"


def test_plot_gamma_curves_writes_a_png(tmp_path):
    path = plot_gamma_curves(tmp_path / "curves.png", [make_result("c", ("a", "b")), make_result("a", ("b", "c"))])

    assert path == tmp_path / "curves.png"
    assert path.read_bytes()[:8] == PNG_SIGNATURE and path.stat().st_size > 1000


def test_plot_features_writes_a_png_with_one_panel_per_run(tmp_path):
    rng = np.random.default_rng(0)
    features = {run: {name: rng.normal(loc=i, size=(5, 6)).astype(np.float32) for i, name in enumerate("abc")}
                for run in ("a", "c")}

    path = plot_features(tmp_path / "features.png", features, ["a", "c"])

    assert path == tmp_path / "features.png"
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    single = plot_features(tmp_path / "one.png", features, ["c"])
    assert single.read_bytes()[:8] == PNG_SIGNATURE
