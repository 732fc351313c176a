"""The benchmark's report on hand-made numbers, and how it reads a run folder's CSV files."""

from __future__ import annotations

import math

import pytest

from experiments.bench.plot import sites_series, write_scaling_plot
from experiments.bench.report import (
    expected_bytes,
    gpu_section,
    largest_first_makespan,
    memory_by_role,
    overhead_section,
    round_time_ratio,
    wire_section,
    write_report,
)
from experiments.bench.run_bench import Plan, parse_plan
from experiments.bench.runs import client_workers, round_times, traffic_per_site

SIZES = {"model": 1_000_000, "selector": 200_000, "moments": 400_000, "sites": 3}


def _traffic_rows():
    rows = []
    for rnd, down in ((1, 2_200_000), (2, 2_600_000), (3, 2_600_000)):
        for site in ("a", "b", "c"):
            rows.append({"round": str(rnd), "stage": "train", "site": site, "direction": "sent",
                         "bytes": str(down + 8), "array-bytes": str(down)})
            rows.append({"round": str(rnd), "stage": "train", "site": site, "direction": "received",
                         "bytes": str(2_600_032), "array-bytes": "2600000"})
    for site in ("a", "b", "c"):
        rows.append({"round": "3", "stage": "evaluate", "site": site, "direction": "sent",
                     "bytes": "4200020", "array-bytes": "4200000"})
    return rows


def _run(rounds, **extra):
    return {"wall-seconds": 100.0, "round-seconds": rounds, "train-seconds": [r / 2 for r in rounds],
            "start-up-seconds": 100.0 - sum(rounds), "setup-seconds": 5.0, "test-seconds": 4.0,
            "test-dice-super": 0.8, "peak-rss-gib": 3.0, **extra}


def test_expected_bytes_by_hand():
    # 2 * 1.0 + 0.2 = 2.2 MB; + 0.4 = 2.6 MB; 4 * 1.0 + 0.2 + 0.4 = 4.6 MB; 4 * 1.0 + 0.2 = 4.2 MB
    assert expected_bytes(SIZES) == {"paper": 2_200_000, "app": 2_600_000, "all-personalized": 4_600_000,
                                     "super-model": 4_200_000}


def test_traffic_per_site_averages_over_sites_and_rounds():
    traffic = traffic_per_site(_traffic_rows())

    # (2.2 + 2.6 + 2.6) / 3 = 2.4666... MB over the 9 training messages sent
    assert traffic["train/sent"]["array-bytes"] == pytest.approx(7_400_000 / 3)
    assert traffic["train/sent"]["messages"] == 9
    assert traffic["train/sent/round-1"] == {"bytes": 2_200_008, "array-bytes": 2_200_000, "messages": 3}
    assert traffic["evaluate/sent"]["array-bytes"] == 4_200_000


def test_wire_section_compares_measured_rows_with_the_accountings():
    lines = wire_section(SIZES, traffic_per_site(_traffic_rows()), eval_every=1)

    text = "\n".join(lines)
    assert "| measured: training, round 1 (no Adam moments yet) | 2.20 | 2.60 | 1.00x |" in text
    assert "| measured: training, rounds 2+ | 2.60 | 2.60 | 1.18x |" in text  # 2.6 / 2.2
    assert "| paper: 2 U-Nets (global, own personalized) + selector | 2.20 | 2.20 | 1.00x |" in text
    assert "| sending all K = 3 personalized models (+ global, selector, moments) | 4.60 | 2.60 | 2.09x |" in text
    assert "| measured: evaluation (validation), per evaluated round | 4.20 | nan |" in text
    # all sites, training per round: (2.4667 + 2.6) * 3 = 15.20 MB
    assert "training 15.20 MB per round" in text


def test_overhead_section_ratios_per_round_and_total():
    flwr = _run([20.0, 10.0])
    local = {"total-seconds": 25.0, "round-seconds": [10.0, 5.0], "train-seconds": [8.0, 4.0],
             "setup-seconds": 2.0, "test-seconds": 2.0, "test-dice-super": 0.8, "max-rss-gib": 1.5}

    text = "\n".join(overhead_section(flwr, local))

    assert "| total wall time | 100.0 | 25.0 | 4.00 |" in text
    assert "| round 1 | 20.0 | 10.0 | 2.00 |" in text
    assert "| mean round | 15.0 | 7.5 | 2.00 |" in text
    assert "| start-up: total minus rounds (flwr) / data and models (in-process) | 70.0 | 2.0 | 35.00 |" in text
    assert "| - | - |" in text  # the ServerApp's setup has no in-process counterpart


def test_gpu_section_says_why_it_skipped_and_computes_images_per_second():
    assert gpu_section({"skipped": "no CUDA GPU"})[-1] == "Skipped: no CUDA GPU."
    lines = gpu_section({"device": "GPU", "image-size": 256, "sites": 6, "round-seconds": [3.0, 2.0],
                         "train-seconds": [2.0, 1.0], "train-images": [100, 100]})
    assert "| 1 | 3.00 | 2.00 | 100 | 50.0 |" in lines
    assert lines[-1].startswith("Overall 66.7 training images per second")  # 200 / 3


def test_write_report_has_the_sections_present(tmp_path):
    run = {**_run([2.0, 4.0]), "sites": 2, "processes-at-peak": 9, "settings": {"image-size": 64}}
    results = {"settings": {"num-server-rounds": 2, "image-size": 64}, "wall-seconds": 12.0, "memory": [run],
               "scaling": [run]}

    text = write_report(tmp_path / "report.md", results)

    assert (tmp_path / "report.md").read_text() == text
    assert "## Peak memory by number of sites" in text and "| 2 | 64 | 3.00 | nan | 9 | 3.0 | 100 |" in text
    assert "| 2 | 64 | 3.0 | 1.5 | 1.50 | 3.00 |" in text
    assert "## Bytes" not in text and "## GPU" not in text


def test_round_times_from_a_timing_file():
    rows = [{"round": "0", "part": "setup", "seconds": "3.5"}, {"round": "2", "part": "round", "seconds": "7"},
            {"round": "1", "part": "round", "seconds": "9"}, {"round": "1", "part": "train", "seconds": "6"},
            {"round": "0", "part": "server-app", "seconds": "30"}]

    times = round_times(rows)

    assert times["round-seconds"] == [9.0, 7.0] and times["train-seconds"] == [6.0]
    assert times["setup-seconds"] == 3.5 and times["server-app-seconds"] == 30.0
    assert math.isnan(times["test-seconds"])
    assert times["site-seconds"] == []  # an app that does not report its sites' own time


def test_round_times_collects_each_round_s_site_seconds():
    rows = [{"round": "2", "part": "train-site", "seconds": "1.5", "site": "site-1"},
            {"round": "1", "part": "train-site", "seconds": "2", "site": "site-2"},
            {"round": "1", "part": "train-site", "seconds": "3", "site": "site-1"}]
    assert round_times(rows)["site-seconds"] == [[2.0, 3.0], [1.5]]


def test_largest_first_by_hand():
    # 2 workers: 6.88 | 4.33; 4.33 + 1.97 = 6.30; + 1.72 = 8.02; 6.88 + 1.20 = 8.08; 8.02 + 1.17 = 9.19
    assert largest_first_makespan([1.20, 1.97, 1.17, 4.33, 1.72, 6.88], 2) == pytest.approx(9.19)
    assert largest_first_makespan([1.0, 2.0, 3.0], 1) == pytest.approx(6.0)  # one worker: the sum
    assert largest_first_makespan([1.0, 2.0, 3.0], 5) == pytest.approx(3.0)  # more workers: the largest
    with pytest.raises(ValueError, match="workers = 0"):
        largest_first_makespan([1.0], 0)


def test_overhead_section_splits_the_training_exchange_into_the_sites_time_and_the_rest():
    flwr = _run([12.0, 8.0], workers=2, **{"site-seconds": [[4.0, 3.0, 2.0], [5.0, 1.0]]})
    local = {"total-seconds": 40.0, "round-seconds": [18.0, 18.0], "train-seconds": [15.0, 17.0],
             "setup-seconds": 2.0, "test-seconds": 2.0, "test-dice-super": 0.8, "max-rss-gib": 1.5}

    text = "\n".join(overhead_section(flwr, local))

    # sums 9 and 6 -> 7.5; largest first on 2 workers: max(4, 3 + 2) = 5 and max(5, 1) = 5 -> 5.0;
    # exchange (6 + 4) / 2 = 5.0, so nothing is left for transfer and queueing
    assert "| the sites' own time, summed | 7.5 |" in text
    assert "| those times on 2 workers, largest first (no transfer, no waiting) | 5.0 |" in text
    assert "| measured training exchange | 5.0 |" in text and "| rest: transfer, decoding, queueing | 0.0 |" in text


def test_each_configuration_runs_once():
    plan = Plan(("wire", "memory", "scaling"), 2, 0.25, (2, 6, 12), (64, 128), {})

    assert plan.configurations() == [(6, 64), (2, 64), (12, 64), (6, 128)]
    assert plan.settings(6, 64)["dataset"] == "synthetic-fundus"
    assert plan.settings(12, 128)["dataset"] == "synthetic-fundus-12"


MIB = 2**20
# At the peak: the ServerApp, two ClientApp workers and a raylet; bytes
PROCESSES = [{"pid": 1, "role": "ServerApp + simulation engine", "rss": 2000 * MIB, "pss": 1500 * MIB,
              "anon": 1200 * MIB},
             {"pid": 2, "role": "ClientApp worker", "rss": 1400 * MIB, "pss": 1000 * MIB, "anon": 800 * MIB},
             {"pid": 3, "role": "ClientApp worker", "rss": 1500 * MIB, "pss": 1100 * MIB, "anon": 900 * MIB},
             {"pid": 4, "role": "Ray services", "rss": 100 * MIB, "pss": 60 * MIB, "anon": 50 * MIB}]
IMPORT_STEPS = [{"step": "python", "rss": 10 * MIB, "pss": 5 * MIB, "anon": 4 * MIB},
                {"step": "torch", "rss": 500 * MIB, "pss": 300 * MIB, "anon": 280 * MIB},
                {"step": "client_app.app (the ClientApp)", "rss": 850 * MIB, "pss": 500 * MIB, "anon": 400 * MIB}]


def test_round_time_ratio_divides_the_in_process_training_between_the_workers():
    # 10 s / (16 s / 2 workers) = 10 / 8 = 1.25
    assert round_time_ratio(10.0, 16.0, 2) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="workers = 0"):
        round_time_ratio(10.0, 16.0, 0)


def test_overhead_section_reports_the_round_time_ratio_against_its_target():
    flwr = _run([12.0, 8.0], workers=2)  # mean round 10 s
    local = {"total-seconds": 40.0, "round-seconds": [18.0, 18.0], "train-seconds": [15.0, 17.0],
             "setup-seconds": 2.0, "test-seconds": 2.0, "test-dice-super": 0.8, "max-rss-gib": 1.5}

    text = "\n".join(overhead_section(flwr, local))

    # training per round (15 + 17) / 2 = 16 s; / 2 workers = 8 s; 10 / 8 = 1.25x, the target itself
    assert "| 10.0 | 8.0 | **1.25x** |" in text and "target <= 1.25x" in text
    assert "Round-time ratio 1.25x against the target of 1.25x (met)" in text


def test_memory_by_role_sums_each_role_in_mib():
    rows = memory_by_role(PROCESSES)

    # workers: 1400 + 1500 = 2900 RSS, 1000 + 1100 = 2100 PSS, 800 + 900 = 1700 anonymous
    assert rows == [("ServerApp + simulation engine", 1, 2000.0, 1500.0, 1200.0),
                    ("ClientApp worker", 2, 2900.0, 2100.0, 1700.0), ("Ray services", 1, 100.0, 60.0, 50.0)]


def _breakdown_results():
    run = {**_run([2.0, 4.0]), "sites": 6, "processes-at-peak": 5, "settings": {"image-size": 64},
           "peak-rss-gib": 5000 / 1024, "peak-pss-gib": 3660 / 1024, "memory-at-peak": PROCESSES}
    small = {**run, "sites": 2, "peak-rss-gib": 3.0, "peak-pss-gib": 2.0, "round-seconds": [1.0, 1.0]}
    return {"settings": {"image-size": 64}, "wall-seconds": 12.0, "runs": {"sites6-px64": run},
            "memory": [small, run], "scaling": [small, run],
            "memory-breakdown": {"run": "sites6-px64", "import-cost": IMPORT_STEPS}}


def test_write_report_breaks_the_peak_down_by_role_and_links_the_scaling_plot(tmp_path):
    text = write_report(tmp_path / "report.md", _breakdown_results())

    assert "## Memory at the peak by process role" in text
    assert "| ClientApp worker | 2 | 2900 | 2100 | 1700 |" in text
    assert "| all | 4 | 5000 | 3660 | 2950 |" in text  # 2000 + 2900 + 100; 1500 + 2100 + 60; 1200 + 1700 + 50
    assert "RSS 5000 MiB (the headline figure), PSS 3660 MiB" in text
    assert "| client_app.app (the ClientApp) | 850 | 500 | 400 | +350 |" in text  # 850 - 500 added by the app
    assert "The 3 processes that import them" in text and "hold 2550 MiB" in text  # 3 * 850
    assert "![Round time and peak memory by sites](scaling.png)" in text
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_scaling_plot_is_drawn_from_the_runs_at_one_image_size(tmp_path):
    runs = _breakdown_results()["scaling"] + [{**_run([9.0]), "sites": 6, "settings": {"image-size": 128}}]

    series = sites_series(runs, 64)
    path = write_scaling_plot(tmp_path / "scaling.png", runs, 64)

    assert series["sites"] == [2, 6] and series["round-seconds"] == [1.0, 3.0]
    assert series["pss-gib"] == [2.0, 3660 / 1024]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scaling_reaches_24_sites_by_default_and_quick_stays_at_2_and_6():
    assert parse_plan([])[0].sites == (2, 4, 6, 12, 24)
    assert parse_plan(["--quick"])[0].sites == (2, 6)


def test_workers_are_planned_as_the_run_script_plans_them():
    # RAY_CPUS = 2 CPUs / CLIENT_CPUS = 1 each: 2 clients at once; with 4 CPUs per client only 1 fits in 4
    assert client_workers(6, {"RAY_CPUS": "2", "CLIENT_CPUS": "1", "CLIENT_GPUS": "0"}) == 2
    assert client_workers(6, {"RAY_CPUS": "4", "CLIENT_CPUS": "4", "CLIENT_GPUS": "0"}) == 1
    assert client_workers(2, {"RAY_CPUS": "16", "CLIENT_CPUS": "1", "CLIENT_GPUS": "0"}) == 2  # one per site at most
