"""Parsing nvidia-smi samples, the busy share inside training windows, and peak memory per process."""

from __future__ import annotations

import pytest

from experiments.gpu.sampling import (
    GpuSample,
    ProcessSample,
    busy_share,
    parse_gpu_lines,
    parse_process_lines,
    peak_memory_per_process,
)


def test_gpu_lines_parse_and_unreadable_lines_are_dropped():
    # Prepare
    text = "0, 87, 40211\n1, [N/A], 10\n2, 5, 1024\n"

    # Execute
    samples = parse_gpu_lines(text, stamp=100.0)

    # Assert
    assert samples == [GpuSample(100.0, 0, 87.0, 40211.0), GpuSample(100.0, 2, 5.0, 1024.0)]


def test_process_lines_parse():
    assert parse_process_lines("4242, 3100\n4243, 2980\n", 7.0) == [ProcessSample(7.0, 4242, 3100.0),
                                                                    ProcessSample(7.0, 4243, 2980.0)]
    assert parse_process_lines("", 7.0) == []


def test_busy_share_averages_only_samples_inside_the_windows():
    # Prepare: training exchanges [10, 20] and [30, 40]; samples outside them (evaluation, start-up) are idle
    samples = [GpuSample(t, 0, busy, 0.0) for t, busy in [(5, 0), (10, 80), (15, 60), (25, 0), (30, 100), (40, 40),
                                                          (45, 0)]]
    samples.append(GpuSample(15, 1, 30, 0.0))

    # Execute
    share = busy_share(samples, [(10.0, 20.0), (30.0, 40.0)])

    # Assert: GPU 0 (0.8 + 0.6 + 1.0 + 0.4) / 4 = 0.7; GPU 1 only one sample, 0.3
    assert share == {0: pytest.approx(0.7), 1: pytest.approx(0.3)}
    assert busy_share(samples, []) == {}


def test_peak_memory_is_the_largest_sample_of_each_process():
    samples = [ProcessSample(1, 11, 100), ProcessSample(2, 11, 300),
               ProcessSample(3, 12, 50), ProcessSample(4, 11, 200)]
    assert peak_memory_per_process(samples) == {11: 300, 12: 50}
