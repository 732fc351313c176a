"""Comparing one FedSM round on two devices: the update arithmetic, CPU against CPU, and CPU against GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from experiments.bench.device_agreement import (
    RELATIVE_TOLERANCE,
    compare_devices,
    compare_updates,
    summation_order_floor,
    tolerance_for,
)

TINY = {"dataset": "synthetic-fundus-2", "image-size": 32, "data-scale": 0.1, "max-local-steps": 1,
        "selector-width": 4, "batch-size": 4}


def test_relative_difference_of_updates_matches_hand_computation():
    # Prepare: update a = [3, 4] (norm 5), update b = [3, 4.5]: difference [0, 0.5] (norm 0.5)
    before = {"w": np.array([1.0, 1.0], dtype=np.float32), "steps": np.array(3, dtype=np.int64)}
    after_a = {"w": np.array([4.0, 5.0], dtype=np.float32), "steps": np.array(4, dtype=np.int64)}
    after_b = {"w": np.array([4.0, 5.5], dtype=np.float32), "steps": np.array(9, dtype=np.int64)}

    # Execute
    result = compare_updates("m", before, after_a, after_b)

    # Assert: integer buffers are not compared
    assert result.update_norm == pytest.approx(5.0) and result.difference_norm == pytest.approx(0.5)
    assert result.relative == pytest.approx(0.1) and result.max_abs_difference == pytest.approx(0.5)
    assert not result.agrees  # 10 % is far above the 1 % tolerance


def test_models_that_did_not_move_agree_and_different_layouts_are_an_error():
    still = {"w": np.zeros(2, dtype=np.float32)}
    assert compare_updates("m", still, still, still).agrees
    with pytest.raises(ValueError, match=r"m: the weights of the two runs hold different arrays \(\['v', 'w'\]\)"):
        compare_updates("m", still, still, {"v": np.zeros(2)})


def test_two_cpu_rounds_from_the_same_seeds_agree_exactly():
    # Execute
    models = compare_devices("cpu", "cpu", TINY)

    # Assert: global, two personalized models and the selector, each updated identically
    assert [m.model for m in models][:2] == ["global", "selector"] and len(models) == 4
    assert all(m.update_norm > 0 and m.difference_norm == 0.0 for m in models)


def test_the_floor_tolerance_passes_another_thread_count_and_fails_a_larger_learning_rate():
    # Prepare: the floor is what summation order alone does (1 thread against all cores)
    floor = summation_order_floor(TINY)
    tolerance = tolerance_for(floor)
    # another thread count than the floor's, so this comparison is not the floor's own (3 threads on 2 cores)
    other = 3 if max(2, os.cpu_count() or 2) != 3 else 2

    # Execute: rounding only (another thread count), and a real change of the arithmetic (lr 10 % larger)
    rounding = compare_devices("cpu", "cpu", {**TINY, "torch-threads": 1}, {"torch-threads": other},
                               tolerance=tolerance)
    bug = compare_devices("cpu", "cpu", TINY, {"lr": 0.0022}, tolerance=tolerance)

    # Assert: the tolerance never drops below 1 %, accepts rounding and rejects the changed learning rate
    assert tolerance == max(RELATIVE_TOLERANCE, 2 * floor)
    assert all(m.agrees for m in rounding), [(m.model, m.relative) for m in rounding]
    assert not bug[0].agrees and bug[0].model == "global", [(m.model, m.relative) for m in bug]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_and_gpu_rounds_agree_within_the_tolerance():
    tolerance = tolerance_for(summation_order_floor(TINY))
    models = compare_devices("cpu", "cuda", TINY, tolerance=tolerance)
    assert all(m.agrees for m in models), [(m.model, m.relative, tolerance) for m in models]
