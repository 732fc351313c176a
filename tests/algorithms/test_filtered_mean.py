"""The filtered mean: hand-computed float64 values, FedAvg when no reply stands out, robust SoftPull with it."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedsm_core.algorithms.fedsm.softpull import soft_pull
from fedsm_core.algorithms.filtered_mean import (
    cosines_to_median,
    distances_to_median,
    filter_scores,
    filtered_mean,
    kept_replies,
    left_out_replies,
)
from fedsm_core.algorithms.robust_aggregation import AggregationSettings, robust_average, robust_soft_pull
from fedsm_core.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerSettings

# Five one-coordinate-pair sites: the coordinate median of (0, 1, 2, 3, 40) and (0, 0, 0, 0, 0) is (2, 0).
FIVE = [{"w": np.array([v, 0.0]), "count": np.array([1])} for v in (0.0, 1.0, 2.0, 3.0, 40.0)]


def test_distances_to_the_coordinate_median_hand_computed():
    # d_k = |v_k - 2| over the float array only (the integer counter is bookkeeping): 2, 1, 0, 1, 38
    np.testing.assert_allclose(distances_to_median(FIVE), [2.0, 1.0, 0.0, 1.0, 38.0], rtol=0, atol=1e-15)


def test_replies_beyond_factor_times_the_median_distance_are_left_out():
    # median distance 1: factor 3 keeps d <= 3 (the first four), factor 40 keeps all
    distances = np.array([2.0, 1.0, 0.0, 1.0, 38.0])
    assert kept_replies(distances, 3.0).tolist() == [True, True, True, True, False]
    assert kept_replies(distances, 40.0).all()
    with pytest.raises(ValueError, match="filter-factor = 0.5 must be >= 1"):
        kept_replies(distances, 0.5)


# Five updates from the origin (10, -5): (1, 0), (1, 1), (2, 0), (-3, 0) (pointing back), (1, -1); their
# coordinate median is (1, 0). Distances to it: 0, 1, 1, 4, 1 (median 1); cosines with it: 1, 1/sqrt(2), 1, -1,
# 1/sqrt(2).
ORIGIN = {"w": np.array([10.0, -5.0]), "count": np.array([7])}
UPDATES = [(1.0, 0.0), (1.0, 1.0), (2.0, 0.0), (-3.0, 0.0), (1.0, -1.0)]
MOVED = [{"w": ORIGIN["w"] + np.array(u), "count": np.array([8])} for u in UPDATES]


def test_cosines_of_the_updates_with_the_median_update_hand_computed():
    np.testing.assert_allclose(cosines_to_median(MOVED, ORIGIN), [1.0, 0.5 ** 0.5, 1.0, -1.0, 0.5 ** 0.5],
                               rtol=0, atol=1e-15)
    # nothing moved: every cosine is 1 (no direction to disagree with)
    assert cosines_to_median([ORIGIN, ORIGIN, ORIGIN], ORIGIN).tolist() == [1.0, 1.0, 1.0]


def test_the_logged_scores_are_the_distance_over_the_median_distance_and_the_cosine():
    scores = filter_scores(MOVED, ORIGIN)
    np.testing.assert_allclose([r for r, _ in scores], [0.0, 1.0, 1.0, 4.0, 1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose([c for _, c in scores], [1.0, 0.5 ** 0.5, 1.0, -1.0, 0.5 ** 0.5], rtol=0, atol=1e-15)
    assert all(np.isnan(c) for _, c in filter_scores(MOVED))  # no origin: no update to take a cosine of


def test_the_direction_bound_leaves_out_a_near_reply_that_points_back():
    # Execute: factor 4 keeps every distance (d <= 4 x 1); a least cosine of 0 leaves out the reversed update
    kept = filtered_mean(MOVED, [1, 1, 1, 1, 1], 4.0, ORIGIN, min_cosine=0.0)

    # Assert: the mean of the other four: origin + ((1 + 1 + 2 + 1) / 4, (0 + 1 + 0 - 1) / 4) = (11.25, -5)
    np.testing.assert_allclose(kept["w"], [11.25, -5.0], rtol=0, atol=1e-15)
    assert left_out_replies(MOVED, 4.0, ORIGIN, 0.0) == [3]
    assert left_out_replies(MOVED, 4.0) == []  # the distance bound alone keeps it


def test_without_the_direction_bound_it_is_the_distance_filtered_mean_bit_for_bit():
    sizes = [3, 1, 4, 1, 5]
    plain = filtered_mean(MOVED, sizes, 4.0)
    for origin in (None, ORIGIN):  # min-cosine -1 (off), with or without the origin
        same = filtered_mean(MOVED, sizes, 4.0, origin, min_cosine=-1.0)
        assert all(np.array_equal(plain[key], same[key]) for key in plain)


def test_the_kept_replies_are_averaged_with_their_sizes_hand_computed():
    # Prepare: sizes 1, 2, 3, 4 for the kept sites, 1000 for the one left out
    sizes = [1, 2, 3, 4, 1000]

    # Execute
    result = filtered_mean(FIVE, sizes, 3.0)

    # Assert: (0*1 + 1*2 + 2*3 + 3*4) / 10 = 2.0; the outlier's claimed 1000 examples weigh nothing
    np.testing.assert_allclose(result["w"], [2.0, 0.0], rtol=0, atol=1e-15)
    assert result["count"].dtype == FIVE[0]["count"].dtype


def _replies(weights: list[dict[str, np.ndarray]], sizes: list[int]) -> list[Message]:
    return [Message(RecordDict({"arrays": ArrayRecord({k: Array(v.copy()) for k, v in site.items()}),
                                "metrics": MetricRecord({"num-examples": size})}), dst_node_id=index + 1,
                    message_type=MessageType.TRAIN) for index, (site, size) in enumerate(zip(weights, sizes,
                                                                                                strict=True))]


def test_with_no_reply_standing_out_it_is_flowers_fedavg_on_the_same_replies(server_process):
    # Prepare: six sites scattered alike around one point, unequal sizes
    rng = np.random.default_rng(5)
    sites = [{"conv": rng.normal(size=(2, 3, 3)), "bias": rng.normal(size=5)} for _ in range(6)]
    sizes = [4, 6, 4, 13, 4, 20]
    assert kept_replies(distances_to_median(sites), 3.0).all()

    # Execute
    ours = robust_average(sites, sizes, AggregationSettings("filtered-mean"))
    theirs, _ = FedAvg().aggregate_train(1, _replies(sites, sizes))

    # Assert
    for key, value in ours.items():
        np.testing.assert_allclose(value, theirs[key].numpy(), rtol=1e-12, atol=1e-12, err_msg=key)


def test_a_sign_flipped_large_site_is_left_out_where_the_mean_follows_it():
    # Prepare: five honest sites move w by about d; the largest site sends w - 4 (w_k - w)
    rng = np.random.default_rng(6)
    start, direction = rng.normal(size=40), rng.normal(size=40)
    honest = [{"w": start + direction + 0.3 * rng.normal(size=40)} for _ in range(5)]
    attacker = {"w": start - 4.0 * (honest[0]["w"] - start)}
    sizes = [4, 6, 4, 13, 4, 20]
    honest_mean = np.average([h["w"] for h in honest], axis=0, weights=sizes[:5])

    # Execute
    mean = robust_average([*honest, attacker], sizes, AggregationSettings("mean"))
    filtered = robust_average([*honest, attacker], sizes, AggregationSettings("filtered-mean"))

    # Assert: the attacker holds 20 of 51 examples, so the mean moves backwards; the filtered mean is the
    # honest sites' weighted mean exactly
    assert np.dot(mean["w"] - start, direction) < 0
    np.testing.assert_allclose(filtered["w"], honest_mean, rtol=1e-12, atol=1e-12)


def test_robust_soft_pull_with_the_filtered_mean_is_soft_pull_when_nothing_stands_out_and_drops_an_outlier():
    # Prepare: four similar personalized models, then the same with the last one blown up
    rng = np.random.default_rng(7)
    similar = {f"site-{k}": {"w": rng.normal(size=8)} for k in range(4)}
    settings = AggregationSettings("filtered-mean")

    # Execute / Assert: SoftPull's unweighted mean of the others when every other model is kept
    pulled, plain = robust_soft_pull(similar, 0.7, settings), soft_pull(similar, 0.7)
    for site in similar:
        np.testing.assert_allclose(pulled[site]["w"], plain[site]["w"], rtol=1e-12, atol=1e-12)

    # site-3 far out: site-0 pulls toward the mean of site-1 and site-2 only
    outlier = {**similar, "site-3": {"w": 100.0 * similar["site-3"]["w"]}}
    pulled = robust_soft_pull(outlier, 0.7, settings)
    expected = 0.7 * similar["site-0"]["w"] + 0.3 * (similar["site-1"]["w"] + similar["site-2"]["w"]) / 2
    np.testing.assert_allclose(pulled["site-0"]["w"], expected, rtol=1e-12, atol=1e-12)


def test_a_global_models_aggregate_leaves_out_a_reversed_update_of_honest_length():
    # Prepare: five honest sites move the global model by about d (the largest one twice as far, as a site that
    # takes more local steps); the attacker sends an honest-length update pointing back (trained on wrong masks)
    rng = np.random.default_rng(8)
    start, direction = {"w": rng.normal(size=40)}, rng.normal(size=40)
    honest = [{"w": start["w"] + scale * direction + 0.6 * rng.normal(size=40)} for scale in (1, 1, 1, 1, 2)]
    attacker = {"w": start["w"] - 0.6 * direction + 0.6 * rng.normal(size=40)}
    sizes = [4, 6, 4, 13, 20, 20]
    settings = ServerOptimizerSettings()

    # Execute: the distance bound alone, then with the direction bound
    plain = ServerOptimizer(settings, AggregationSettings("filtered-mean"))
    directed = ServerOptimizer(settings, AggregationSettings("filtered-mean", filter_min_cosine=0.0))
    sites = [f"site-{k}" for k in range(1, 7)]  # the memory's first round: each site's mean ratio is its ratio
    without_bound = plain.aggregate(start, [*honest, attacker], sizes, [1] * 6, 1, sites)
    with_bound = directed.aggregate(start, [*honest, attacker], sizes, [1] * 6, 1, sites)

    # Assert: the reversed update lies within three median distances, so only the direction bound leaves it out;
    # what remains is the honest sites' weighted mean
    assert plain.left_out == [] and directed.left_out == [5]
    assert directed.scores == plain.scores and directed.scores[5][1] < 0 < min(c for _, c in directed.scores[:5])
    np.testing.assert_allclose(with_bound["w"], np.average([h["w"] for h in honest], axis=0, weights=sizes[:5]),
                               rtol=1e-12, atol=1e-12)
    assert np.dot(with_bound["w"] - start["w"], direction) > np.dot(without_bound["w"] - start["w"], direction)
