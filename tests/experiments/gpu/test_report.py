"""The GPU check's report, written from made-up numbers (no GPU needed)."""

from __future__ import annotations

from support.gpu_results import FAKE

from experiments.gpu.report import format_report, write_report


def test_report_states_every_measurement_and_the_verdicts(tmp_path):
    # Execute
    write_report(tmp_path / "report.md", FAKE)
    text = (tmp_path / "report.md").read_text()

    # Assert
    assert "Fake GPU 80GB" in text and "7 passed in 3.0s" in text
    assert "seconds per round: 20.0, 10.0, 12.5" in text
    assert "images per second in the training exchange: 50.0, 80.0, 100.0" in text  # 400 / 8, 400 / 5, 400 / 4
    assert "GPU 0 72%; mean 72%: meets the 60% target" in text
    assert "| 4242 ray::ClientAppActor | 3100 |" in text
    assert "| global | 0.5 | 2.00e-06 | 1.00e-07 | yes |" in text
    assert "| selector | 0.2 | 3.00e-01 | 1.00e-02 | NO |" in text and "DISAGREE" in text


def test_low_busy_share_and_failed_parts_are_reported():
    # Prepare
    results = {**FAKE, "simulation": {**FAKE["simulation"], "busy-share": {0: 0.35}},
               "agreement": {"error": "RuntimeError: boom"}, "tests": {"status": 1, "summary": "1 failed"}}

    # Execute
    text = format_report(results)

    # Assert
    assert "mean 35%: BELOW the 60% target" in text
    assert "Failed: RuntimeError: boom" in text
    assert "FAILED (pytest exit status 1)" in text

