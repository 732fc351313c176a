"""Tests of FedAvg's weighted average of weight dictionaries."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.algorithms.aggregation import normalized_average, weighted_average
from fedsm_core.models.weights import check_same_layout


def test_weighted_average_matches_hand_computed_float64():
    # Prepare
    # n = 1 + 3 = 4, so the weights are 1/4 and 3/4:
    #   w = 0.25 * [[1, 2], [3, 4]] + 0.75 * [[5, 6], [7, 8]]
    #     = [[0.25 + 3.75, 0.5 + 4.5], [0.75 + 5.25, 1.0 + 6.0]]
    #     = [[4, 5], [6, 7]]
    #   b = 0.25 * [-2] + 0.75 * [2] = [-0.5 + 1.5] = [1]
    first = {"w": np.array([[1.0, 2.0], [3.0, 4.0]]), "b": np.array([-2.0])}
    second = {"w": np.array([[5.0, 6.0], [7.0, 8.0]]), "b": np.array([2.0])}

    # Execute
    averaged = weighted_average([first, second], [1, 3])

    # Assert
    np.testing.assert_array_equal(averaged["w"], np.array([[4.0, 5.0], [6.0, 7.0]]))
    np.testing.assert_array_equal(averaged["b"], np.array([1.0]))
    assert averaged["w"].dtype == np.float64
    assert set(averaged) == {"w", "b"}


def test_weighted_average_with_thirds():
    # Prepare
    # n = 1 + 2 = 3: w = (1/3) * 3 + (2/3) * 6 = 1 + 4 = 5;  (1/3) * 0 + (2/3) * 1.5 = 1
    first = {"w": np.array([3.0, 0.0])}
    second = {"w": np.array([6.0, 1.5])}

    # Execute
    averaged = weighted_average([first, second], [1.0, 2.0])

    # Assert
    np.testing.assert_allclose(averaged["w"], [5.0, 1.0], rtol=1e-15, atol=1e-15)


def test_equal_sizes_give_the_plain_mean():
    # Prepare
    rng = np.random.default_rng(0)
    weights = [{"w": rng.normal(size=(3, 4)), "b": rng.normal(size=4)} for _ in range(5)]

    # Execute
    averaged = weighted_average(weights, [7] * 5)

    # Assert
    for key in ("w", "b"):
        expected = np.mean([w[key] for w in weights], axis=0)
        np.testing.assert_allclose(averaged[key], expected, rtol=1e-13, atol=1e-15)


def test_zero_size_client_is_ignored():
    # Prepare
    # n = 0 + 2 = 2: w = 0 * [100] + 1 * [3] = [3]
    weights = [{"w": np.array([100.0])}, {"w": np.array([3.0])}]

    # Execute
    averaged = weighted_average(weights, [0, 2])

    # Assert
    np.testing.assert_array_equal(averaged["w"], [3.0])


def test_integer_arrays_are_rounded_and_keep_their_dtype():
    # Prepare
    # equal sizes: (0 + 1 + 1) / 3 = 0.667 -> 1;  (4 + 4 + 6) / 3 = 4.667 -> 5;  (9 + 9 + 9) / 3 = 9
    weights = [
        {"count": np.array([0, 4, 9], dtype=np.int64)},
        {"count": np.array([1, 4, 9], dtype=np.int64)},
        {"count": np.array([1, 6, 9], dtype=np.int64)},
    ]

    # Execute
    averaged = weighted_average(weights, [1, 1, 1])

    # Assert
    assert averaged["count"].dtype == np.int64
    np.testing.assert_array_equal(averaged["count"], [1, 5, 9])


def test_float32_in_float32_out():
    # Prepare
    weights = [{"w": np.array([1.0, 2.0], np.float32)}, {"w": np.array([3.0, 4.0], np.float32)}]

    # Execute
    averaged = weighted_average(weights, [1, 1])

    # Assert
    assert averaged["w"].dtype == np.float32
    np.testing.assert_array_equal(averaged["w"], np.array([2.0, 3.0], np.float32))


def test_inputs_are_not_modified():
    # Prepare
    first = {"w": np.array([1.0, 2.0])}
    second = {"w": np.array([3.0, 4.0])}

    # Execute
    averaged = weighted_average([first, second], [1, 1])
    averaged["w"][:] = -1.0

    # Assert
    np.testing.assert_array_equal(first["w"], [1.0, 2.0])
    np.testing.assert_array_equal(second["w"], [3.0, 4.0])


def test_empty_list_raises():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="no weights to average"):
        weighted_average([], [])


def test_mismatched_keys_raise():
    # Prepare
    weights = [{"w": np.zeros(2), "b": np.zeros(1)}, {"w": np.zeros(2), "extra": np.zeros(1)}]

    # Execute / Assert
    with pytest.raises(ValueError, match=r"weight set 1: keys differ.*missing \['b'\].*unexpected \['extra'\]"):
        weighted_average(weights, [1, 1])


def test_mismatched_shapes_raise():
    # Prepare
    weights = [{"w": np.zeros((2, 3))}, {"w": np.zeros((3, 2))}]

    # Execute / Assert
    with pytest.raises(ValueError, match=r"weight set 1: 'w' has shape \(3, 2\), expected \(2, 3\)"):
        weighted_average(weights, [1, 1])


@pytest.mark.parametrize("sizes", [[-1, 2], [0, 0], [1, -1]])
def test_negative_or_zero_sizes_raise(sizes):
    # Prepare
    weights = [{"w": np.zeros(2)}, {"w": np.ones(2)}]

    # Execute / Assert
    with pytest.raises(ValueError, match="sizes must be >= 0 with a positive sum"):
        weighted_average(weights, sizes)


def test_number_of_sizes_must_match():
    # Prepare
    weights = [{"w": np.zeros(2)}, {"w": np.ones(2)}]

    # Execute / Assert
    with pytest.raises(ValueError, match="2 weight sets but 3 sizes"):
        weighted_average(weights, [1, 1, 1])


def test_check_same_layout_names_the_source():
    # Prepare
    reference = {"w": np.zeros(3)}

    # Execute / Assert
    check_same_layout(reference, {"w": np.ones(3)}, "reply of site-1")  # same layout: no error
    with pytest.raises(ValueError, match="reply of site-3: 'w' has shape"):
        check_same_layout(reference, {"w": np.ones(4)}, "reply of site-3")


def test_nan_size_is_rejected():
    with pytest.raises(ValueError, match="sizes must be >= 0"):
        weighted_average([{"w": np.ones(1)}], [float("nan")])


def test_fednova_with_equal_local_steps_is_fedavg():
    rng = np.random.default_rng(4)
    current = {"w": rng.normal(size=(3, 2))}
    sites = [{"w": rng.normal(size=(3, 2))} for _ in range(3)]

    normalized = normalized_average(current, sites, [5, 2, 9], [4, 4, 4])

    np.testing.assert_allclose(normalized["w"], weighted_average(sites, [5, 2, 9])["w"], rtol=0, atol=1e-14)


def test_fednova_by_hand_divides_each_update_by_its_steps():
    # Prepare: w = 0; site a (n = 1, 2 steps) reaches 4, site b (n = 3, 6 steps) reaches 3
    # p = (1/4, 3/4), tau_eff = 1/4 * 2 + 3/4 * 6 = 5; per-step updates 4/2 = 2 and 3/6 = 0.5
    # w <- 0 + 5 * (1/4 * 2 + 3/4 * 0.5) = 5 * 0.875 = 4.375 (FedAvg: 1/4 * 4 + 3/4 * 3 = 3.25)
    current = {"w": np.array([0.0]), "count": np.array([10])}
    sites = [{"w": np.array([4.0]), "count": np.array([12])}, {"w": np.array([3.0]), "count": np.array([16])}]

    normalized = normalized_average(current, sites, [1, 3], [2, 6])

    assert normalized["w"][0] == pytest.approx(4.375, abs=1e-15)
    assert normalized["count"].dtype == np.int64


def test_fednova_refuses_a_site_without_steps():
    with pytest.raises(ValueError, match="one step count >= 1 per site"):
        normalized_average({"w": np.zeros(1)}, [{"w": np.ones(1)}], [1], [0])
