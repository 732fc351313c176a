"""Tests of SoftPull, the personalized-model update of FedSM (Eq. 4)."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.algorithms.fedsm.softpull import check_lam, soft_pull


def _three_sites() -> dict[str, dict[str, np.ndarray]]:
    return {
        "a": {"w": np.array([1.0, 2.0])},
        "b": {"w": np.array([3.0, 4.0])},
        "c": {"w": np.array([5.0, 6.0])},
    }


def test_hand_computed_three_sites_float64():
    # Prepare
    # K = 3, lam = 0.5, so each other site weighs (1 - 0.5) / (3 - 1) = 0.25:
    #   a: 0.5 * [1, 2] + 0.25 * ([3, 4] + [5, 6]) = [0.5, 1.0] + [2.0, 2.5] = [2.5, 3.5]
    #   b: 0.5 * [3, 4] + 0.25 * ([1, 2] + [5, 6]) = [1.5, 2.0] + [1.5, 2.0] = [3.0, 4.0]
    #   c: 0.5 * [5, 6] + 0.25 * ([1, 2] + [3, 4]) = [2.5, 3.0] + [1.0, 1.5] = [3.5, 4.5]
    personalized = _three_sites()

    # Execute
    pulled = soft_pull(personalized, 0.5)

    # Assert
    assert list(pulled) == ["a", "b", "c"]
    np.testing.assert_array_equal(pulled["a"]["w"], [2.5, 3.5])
    np.testing.assert_array_equal(pulled["b"]["w"], [3.0, 4.0])
    np.testing.assert_array_equal(pulled["c"]["w"], [3.5, 4.5])


def test_hand_computed_three_sites_lam_07():
    # Prepare
    # K = 3, lam = 0.7, others weigh (1 - 0.7) / 2 = 0.15:
    #   a: 0.7 * 1 + 0.15 * (3 + 5) = 0.7 + 1.2 = 1.9;   0.7 * 2 + 0.15 * (4 + 6) = 1.4 + 1.5 = 2.9
    #   b: 0.7 * 3 + 0.15 * (1 + 5) = 2.1 + 0.9 = 3.0;   0.7 * 4 + 0.15 * (2 + 6) = 2.8 + 1.2 = 4.0
    #   c: 0.7 * 5 + 0.15 * (1 + 3) = 3.5 + 0.6 = 4.1;   0.7 * 6 + 0.15 * (2 + 4) = 4.2 + 0.9 = 5.1
    personalized = _three_sites()

    # Execute
    pulled = soft_pull(personalized, 0.7)

    # Assert
    np.testing.assert_allclose(pulled["a"]["w"], [1.9, 2.9], rtol=1e-14)
    np.testing.assert_allclose(pulled["b"]["w"], [3.0, 4.0], rtol=1e-14)
    np.testing.assert_allclose(pulled["c"]["w"], [4.1, 5.1], rtol=1e-14)


def test_lam_one_over_k_gives_every_site_the_plain_average():
    # Prepare
    rng = np.random.default_rng(1)
    sites = [f"site-{i}" for i in range(4)]
    personalized = {s: {"w": rng.normal(size=(2, 3)), "b": rng.normal(size=3)} for s in sites}

    # Execute
    pulled = soft_pull(personalized, 1.0 / 4)

    # Assert
    for key in ("w", "b"):
        mean = np.mean([personalized[s][key] for s in sites], axis=0)
        for site in sites:
            np.testing.assert_allclose(pulled[site][key], mean, rtol=1e-12, atol=1e-14)


def test_lam_one_is_identity():
    # Prepare
    rng = np.random.default_rng(2)
    personalized = {s: {"w": rng.normal(size=(3, 3))} for s in ("a", "b", "c")}

    # Execute
    pulled = soft_pull(personalized, 1.0)

    # Assert
    for site in personalized:
        np.testing.assert_array_equal(pulled[site]["w"], personalized[site]["w"])
        assert pulled[site]["w"] is not personalized[site]["w"]


def test_single_site_returns_a_copy():
    # Prepare
    original = np.array([1.0, 2.0, 3.0])
    personalized = {"only": {"w": original}}

    # Execute
    pulled = soft_pull(personalized, 1.0)
    pulled["only"]["w"][0] = 99.0

    # Assert
    np.testing.assert_array_equal(original, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(pulled["only"]["w"], [99.0, 2.0, 3.0])


@pytest.mark.parametrize(("lam", "num_sites"), [(0.2, 3), (1.5, 3), (-0.1, 2), (0.5, 1)])
def test_lam_outside_range_raises(lam, num_sites):
    # Prepare
    personalized = {f"s{i}": {"w": np.zeros(2)} for i in range(num_sites)}

    # Execute / Assert
    with pytest.raises(ValueError, match="softpull-lambda"):
        soft_pull(personalized, lam)


def test_lam_exactly_one_over_k_is_accepted():
    # Prepare / Execute / Assert
    check_lam(1.0 / 3, 3)
    check_lam(1.0, 3)
    with pytest.raises(ValueError, match=r"softpull-lambda = 0\.3 is outside \[1/K, 1\]"):
        check_lam(0.3, 3)
    with pytest.raises(ValueError, match="at least one site"):
        check_lam(1.0, 0)


def test_integer_buffers_are_untouched():
    # Prepare
    personalized = {
        "a": {"w": np.array([0.0]), "num_batches": np.array(3, dtype=np.int64)},
        "b": {"w": np.array([4.0]), "num_batches": np.array(10, dtype=np.int64)},
    }

    # Execute
    # K = 2, lam = 0.5: others weigh 0.5, so w_a = w_b = 0.5 * 0 + 0.5 * 4 = 2
    pulled = soft_pull(personalized, 0.5)

    # Assert
    np.testing.assert_array_equal(pulled["a"]["w"], [2.0])
    np.testing.assert_array_equal(pulled["b"]["w"], [2.0])
    assert pulled["a"]["num_batches"] == 3
    assert pulled["b"]["num_batches"] == 10
    assert pulled["a"]["num_batches"].dtype == np.int64


def test_float32_in_float32_out():
    # Prepare
    personalized = {
        "a": {"w": np.array([1.0, 2.0], np.float32)},
        "b": {"w": np.array([3.0, 6.0], np.float32)},
    }

    # Execute
    # K = 2, lam = 0.75: a = 0.75 * [1, 2] + 0.25 * [3, 6] = [1.5, 3.0]; b = [2.5, 5.0]
    pulled = soft_pull(personalized, 0.75)

    # Assert
    for site in ("a", "b"):
        assert pulled[site]["w"].dtype == np.float32
    np.testing.assert_array_equal(pulled["a"]["w"], np.array([1.5, 3.0], np.float32))
    np.testing.assert_array_equal(pulled["b"]["w"], np.array([2.5, 5.0], np.float32))


def test_mismatched_layout_raises():
    # Prepare
    personalized = {"a": {"w": np.zeros(2)}, "b": {"w": np.zeros(3)}}

    # Execute / Assert
    with pytest.raises(ValueError, match="personalized model of b: 'w' has shape"):
        soft_pull(personalized, 0.5)
