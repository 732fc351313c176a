"""Robust aggregation: hand-computed float64 values, reductions to FedAvg and SoftPull, agreement with Flower's own."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedMedian, FedTrimmedAvg, Krum

from fedsm_core.algorithms.aggregation import weighted_average
from fedsm_core.algorithms.fedsm.softpull import soft_pull
from fedsm_core.algorithms.robust_aggregation import (
    AggregationSettings,
    coordinate_median,
    krum,
    robust_average,
    robust_soft_pull,
    trimmed_mean,
)

# Five sites, two keys. Per coordinate, sorted:
#   w[0]: 1, 2, 3, 4, 100     w[1]: 10, 20, 30, 40, 50     w[2]: -4, -2, 0, 6, 8
#   b[0, 0]: -1.5, -0.25, 0.5, 1.0, 2.5
FIVE = [
    {"w": np.array([1.0, 10.0, -2.0]), "b": np.array([[0.5]])},
    {"w": np.array([2.0, 30.0, -4.0]), "b": np.array([[-1.5]])},
    {"w": np.array([3.0, 20.0, 0.0]), "b": np.array([[2.5]])},
    {"w": np.array([4.0, 50.0, 8.0]), "b": np.array([[1.0]])},
    {"w": np.array([100.0, 40.0, 6.0]), "b": np.array([[-0.25]])},
]


@pytest.mark.parametrize(("trim_fraction", "w", "b"), [
    # beta = 0.2: cut int(0.2 * 5) = 1 per end: w = [(2+3+4)/3, (20+30+40)/3, (-2+0+6)/3] = [3, 30, 4/3];
    # b = (-0.25 + 0.5 + 1.0) / 3 = 1.25 / 3
    (0.2, [3.0, 30.0, 4.0 / 3.0], [[1.25 / 3.0]]),
    # beta = 0.1: cut int(0.5) = 0, the plain mean: w = [110/5, 150/5, 8/5] = [22, 30, 1.6]; b = 2.25 / 5 = 0.45
    (0.1, [22.0, 30.0, 1.6], [[0.45]]),
    # beta = 0.4: cut int(2.0) = 2, only the middle value remains (the median): w = [3, 30, 0]; b = 0.5
    (0.4, [3.0, 30.0, 0.0], [[0.5]]),
], ids=["cut-one", "cut-none", "cut-two"])
def test_trimmed_mean_of_five_hand_computed(trim_fraction, w, b):
    # Execute
    result = trimmed_mean(FIVE, trim_fraction)

    # Assert
    np.testing.assert_allclose(result["w"], w, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(result["b"], b, rtol=1e-15, atol=1e-15)
    assert result["w"].dtype == np.float64 and result["b"].shape == (1, 1)


def test_coordinate_median_of_five_and_of_four_hand_computed():
    # Execute
    odd, even = coordinate_median(FIVE), coordinate_median(FIVE[:4])

    # Assert: K = 5, the middle value: w = [3, 30, 0], b = 0.5
    np.testing.assert_array_equal(odd["w"], [3.0, 30.0, 0.0])
    np.testing.assert_array_equal(odd["b"], [[0.5]])
    # K = 4, the mean of the two middle values: w[0] of 1, 2, 3, 4 -> 2.5; w[1] of 10, 20, 30, 50 -> 25;
    # w[2] of -4, -2, 0, 8 -> -1; b of -1.5, 0.5, 1.0, 2.5 -> 0.75
    np.testing.assert_array_equal(even["w"], [2.5, 25.0, -1.0])
    np.testing.assert_array_equal(even["b"], [[0.75]])


def test_krum_picks_the_update_nearest_its_neighbours_hand_computed():
    # Prepare: points (a, b) = (0, 0), (1, 0), (0, 2), (1, 1), (10, 10); f = 1, so K - f - 2 = 2 neighbours.
    # Squared distances over both keys: d01 = 1, d02 = 4, d03 = 2, d04 = 200, d12 = 5, d13 = 1, d14 = 181,
    # d23 = 2, d24 = 164, d34 = 162. Scores (two smallest): s0 = 1 + 2 = 3, s1 = 1 + 1 = 2, s2 = 2 + 4 = 6,
    # s3 = 1 + 2 = 3, s4 = 162 + 164 = 326: update 1 wins. (Counting itself, or key a alone, would pick 0.)
    points = [(0.0, 0.0), (1.0, 0.0), (0.0, 2.0), (1.0, 1.0), (10.0, 10.0)]
    updates = [{"a": np.array([a]), "b": np.array([b])} for a, b in points]

    # Execute
    chosen, index = krum(updates, byzantine=1)

    # Assert
    assert index == 1
    assert chosen == {"a": np.array([1.0]), "b": np.array([0.0])}
    assert chosen["a"] is not updates[1]["a"]  # a copy, not the site's array


def test_krum_tie_goes_to_the_lowest_index():
    # Prepare: five identical updates score 0 each
    updates = [{"a": np.array([2.0])} for _ in range(5)]

    # Execute / Assert
    assert krum(updates, byzantine=1)[1] == 0


def test_mean_is_weighted_average_bit_for_bit():
    # Prepare
    rng = np.random.default_rng(0)
    weights = [{"w": rng.normal(size=(3, 4)).astype(np.float32), "n": np.array([k, 2 * k])} for k in range(5)]
    sizes = [3, 1, 4, 1, 5]

    # Execute
    result = robust_average(weights, sizes, AggregationSettings())

    # Assert
    expected = weighted_average(weights, sizes)
    for key in expected:
        np.testing.assert_array_equal(result[key], expected[key])
        assert result[key].dtype == expected[key].dtype


def test_robust_statistics_ignore_the_claimed_sizes():
    # Prepare: site 4 claims 1000 times the others' count
    honest, inflated = [1, 1, 1, 1, 1], [1, 1, 1, 1, 1000]

    for name in ("trimmed-mean", "median", "krum"):
        settings = AggregationSettings(name)
        # Execute
        fair, claimed = robust_average(FIVE, honest, settings), robust_average(FIVE, inflated, settings)

        # Assert: the same bits; the weighted mean would follow site 4 almost entirely
        for key in fair:
            np.testing.assert_array_equal(fair[key], claimed[key], err_msg=f"{name} {key}")


def _personalized(rng: np.random.Generator, count: int) -> dict[str, dict[str, np.ndarray]]:
    return {f"site-{k}": {"w": rng.normal(size=(2, 3)).astype(np.float32), "b": rng.normal(size=4),
                          "count": np.array([k, 10 + k])} for k in range(count)}


def test_robust_soft_pull_under_mean_is_soft_pull():
    # Prepare
    personalized = _personalized(np.random.default_rng(1), 5)

    # Execute
    ours, theirs = robust_soft_pull(personalized, 0.6, AggregationSettings("mean")), soft_pull(personalized, 0.6)

    # Assert
    for site, expected in theirs.items():
        for key, value in expected.items():
            np.testing.assert_allclose(ours[site][key], value, rtol=1e-12)
            assert ours[site][key].dtype == value.dtype


def test_robust_soft_pull_with_median_hand_computed():
    # Prepare: scalars 0, 2, 4, 100 and lam = 0.5. Median of the others:
    # a: {2, 4, 100} -> 4, 0.5 * 0 + 0.5 * 4 = 2;   b: {0, 4, 100} -> 4, 0.5 * 2 + 0.5 * 4 = 3;
    # c: {0, 2, 100} -> 2, 0.5 * 4 + 0.5 * 2 = 3;   d: {0, 2, 4} -> 2, 0.5 * 100 + 0.5 * 2 = 51
    personalized = {site: {"p": np.array([value])} for site, value in zip("abcd", (0.0, 2.0, 4.0, 100.0), strict=True)}

    # Execute
    pulled = robust_soft_pull(personalized, 0.5, AggregationSettings("median"))

    # Assert: the plain SoftPull would give a = 0.5 * 0 + 0.5 * 106 / 3 = 17.67
    assert {site: float(w["p"][0]) for site, w in pulled.items()} == {"a": 2.0, "b": 3.0, "c": 3.0, "d": 51.0}


def test_robust_soft_pull_with_krum_pulls_toward_krums_choice_among_the_others():
    # Prepare: six sites, f = 1, so Krum over the five others (5 >= 2f + 3)
    personalized = _personalized(np.random.default_rng(2), 6)
    sites = list(personalized)

    # Execute
    pulled = robust_soft_pull(personalized, 0.7, AggregationSettings("krum", krum_byzantine=1))

    # Assert: w_k <- 0.7 w_k + 0.3 krum(others); counters stay the site's own
    for site in sites:
        pick, _ = krum([personalized[other] for other in sites if other != site], byzantine=1)
        expected = 0.7 * personalized[site]["b"] + (1 - 0.7) * pick["b"]
        np.testing.assert_allclose(pulled[site]["b"], expected, rtol=1e-12, atol=1e-15)
        assert pulled[site]["w"].dtype == np.float32
        np.testing.assert_array_equal(pulled[site]["count"], personalized[site]["count"])


def _replies(weights: list[dict[str, np.ndarray]]) -> list[Message]:
    return [Message(RecordDict({"arrays": ArrayRecord({k: Array(v.copy()) for k, v in site.items()}),
                                "metrics": MetricRecord({"num-examples": 10 + index})}), dst_node_id=index + 1,
                    message_type=MessageType.TRAIN) for index, site in enumerate(weights)]


def _sites_with_outlier(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    sites = [{"conv": rng.normal(size=(2, 3, 3)), "bias": rng.normal(size=5)} for _ in range(count)]
    sites[-1] = {key: -8.0 * value for key, value in sites[-1].items()}
    return sites


@pytest.mark.parametrize(("settings", "flower", "count"), [
    (AggregationSettings("trimmed-mean", trim_fraction=0.2), lambda: FedTrimmedAvg(beta=0.2), 6),
    (AggregationSettings("trimmed-mean", trim_fraction=0.34), lambda: FedTrimmedAvg(beta=0.34), 6),
    # 0.3 * 10 = 3.0000000000000004: both cut 3 per end
    (AggregationSettings("trimmed-mean", trim_fraction=0.3), lambda: FedTrimmedAvg(beta=0.3), 10),
    (AggregationSettings("median"), FedMedian, 6),
    (AggregationSettings("median"), FedMedian, 5),
    (AggregationSettings("krum", krum_byzantine=0), lambda: Krum(num_malicious_nodes=0), 6),
    (AggregationSettings("krum", krum_byzantine=1), lambda: Krum(num_malicious_nodes=1), 6),
    (AggregationSettings("krum", krum_byzantine=3), lambda: Krum(num_malicious_nodes=3), 10),
], ids=["trim-0.2", "trim-0.34", "trim-0.3-of-10", "median-6", "median-5", "krum-f0", "krum-f1", "krum-f3-of-10"])
def test_each_statistic_agrees_with_flowers_strategy_on_the_same_replies(server_process, settings, flower, count):
    # Prepare
    sites = _sites_with_outlier(count)

    # Execute: ours on the weight dictionaries, Flower's on reply messages carrying the same arrays
    ours = robust_average(sites, [10 + k for k in range(count)], settings)
    theirs, _ = flower().aggregate_train(1, _replies(sites))

    # Assert
    assert set(theirs) == set(ours)
    for key, value in ours.items():
        np.testing.assert_allclose(value, theirs[key].numpy(), rtol=1e-12, atol=1e-12, err_msg=key)


def test_one_sign_flipped_site_moves_the_mean_far_but_not_the_robust_statistics():
    # Prepare: four honest sites move w by about d; site 5 sends w - 10 (w_k - w) and claims 100x the images
    rng = np.random.default_rng(4)
    start, direction = rng.normal(size=40), rng.normal(size=40)
    honest = [{"w": start + direction + 0.1 * rng.normal(size=40)} for _ in range(4)]
    attacker = {"w": start - 10.0 * (honest[0]["w"] - start)}
    honest_mean, scale = np.mean([h["w"] for h in honest], axis=0), np.linalg.norm(direction)

    def distance(name: str) -> float:
        aggregate = robust_average([*honest, attacker], [10, 10, 10, 10, 1000], AggregationSettings(name))
        return float(np.linalg.norm(aggregate["w"] - honest_mean))

    # Execute / Assert: the mean lands about 11 |d| away; the robust statistics stay within a fifth of |d|
    assert distance("mean") > 5.0 * scale
    for name in ("trimmed-mean", "median", "krum"):
        assert distance(name) < 0.2 * scale, name


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="aggregation = 'max' is not one of"):
        AggregationSettings("max")
    with pytest.raises(ValueError, match=r"trim-fraction = 0.5 is outside"):
        AggregationSettings("trimmed-mean", trim_fraction=0.5)
    with pytest.raises(ValueError, match=r"krum-byzantine = -1 is outside"):
        AggregationSettings("krum", krum_byzantine=-1)
    with pytest.raises(ValueError, match=r"trim-fraction = 0.5 is outside \[0, 0.5\)"):
        trimmed_mean(FIVE, 0.5)


def test_bad_weights_are_rejected_with_what_was_found():
    # Prepare
    missing_key = [*FIVE[:4], {"w": FIVE[4]["w"]}]
    wrong_shape = [*FIVE[:4], {"w": np.zeros(2), "b": FIVE[4]["b"]}]

    # Execute / Assert
    with pytest.raises(ValueError, match=r"weight set 4: keys differ from the model \(missing \['b'\]"):
        trimmed_mean(missing_key, 0.2)
    with pytest.raises(ValueError, match=r"'w' has shape \(2,\), expected \(3,\)"):
        coordinate_median(wrong_shape)
    with pytest.raises(ValueError, match="no weights to aggregate"):
        krum([], byzantine=0)
    with pytest.raises(ValueError, match="5 weight sets but 4 sizes"):
        robust_average(FIVE, [1, 1, 1, 1], AggregationSettings("median"))


def test_krum_refuses_too_few_updates():
    # Execute / Assert: f = 1 needs K >= 5; robust SoftPull over K - 1 others needs K >= 6
    with pytest.raises(ValueError, match=r"Krum needs K >= 2f \+ 3 = 5 updates, got K = 4"):
        krum(FIVE[:4], byzantine=1)
    personalized = {f"site-{k}": w for k, w in enumerate(FIVE)}
    with pytest.raises(ValueError, match=r"K - 1 = 4 other sites, which needs K - 1 >= 2f \+ 3 = 5"):
        robust_soft_pull(personalized, 0.5, AggregationSettings("krum", krum_byzantine=1))


@pytest.mark.parametrize("name", ["mean", "trimmed-mean", "median", "krum"])
def test_inputs_are_not_modified_and_dtypes_are_kept(name):
    # Prepare: integer counters of 0, 1, 1, 5, 9 trim to (1 + 1 + 5) / 3 = 2.33 -> 2
    weights = [{"w": np.full(3, k, dtype=np.float32), "count": np.array([c], dtype=np.int64)}
               for k, c in enumerate((0, 1, 1, 5, 9))]
    personalized = {f"site-{k}": w for k, w in enumerate(weights)}
    before, before_personalized = copy.deepcopy(weights), copy.deepcopy(personalized)
    settings = AggregationSettings(name, krum_byzantine=0)

    # Execute
    aggregate = robust_average(weights, [1, 2, 3, 4, 5], settings)
    pulled = robust_soft_pull(personalized, 0.5, settings)

    # Assert
    for after, original in [*zip(weights, before, strict=True),
                            *zip(personalized.values(), before_personalized.values(), strict=True)]:
        for key in original:
            np.testing.assert_array_equal(after[key], original[key])
    assert aggregate["w"].dtype == np.float32 and aggregate["count"].dtype == np.int64
    assert all(w["w"].dtype == np.float32 and w["count"].dtype == np.int64 for w in pulled.values())
    if name == "trimmed-mean":
        assert aggregate["count"][0] == 2
