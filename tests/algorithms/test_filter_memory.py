"""The filtered mean's memory: hand-computed mean distance ratios, the site it keeps out, and its checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.algorithms.filter_memory import MEMORY_KEY, FilterMemory
from fedsm_core.algorithms.robust_aggregation import AggregationSettings
from fedsm_core.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerSettings

SITES = [f"site-{i}" for i in range(1, 7)]
START = {"w": np.zeros(1)}
# One coordinate, so the distances are plain: round 1's replies 1..5 and 20 have median 3.5 and distances
# 2.5, 1.5, 0.5, 0.5, 1.5, 16.5 (median distance 1.5): site-6's ratio is 11. Round 2's site-6 sends 8: its distance
# 4.5 is exactly three median distances, within filter-factor 3, and its mean ratio over both rounds is (11 + 3) / 2.
ROUND_1 = [{"w": np.array([v], dtype=np.float64)} for v in (1.0, 2.0, 3.0, 4.0, 5.0, 20.0)]
ROUND_2 = [{"w": np.array([v], dtype=np.float64)} for v in (1.0, 2.0, 3.0, 4.0, 5.0, 8.0)]
SIZES = [1.0] * 6


def optimizer(memory: bool) -> ServerOptimizer:
    return ServerOptimizer(ServerOptimizerSettings(), AggregationSettings("filtered-mean", filter_memory=memory))


def test_mean_ratios_are_the_hand_computed_means_over_the_rounds_each_site_replied_in():
    memory = FilterMemory()
    memory.record(["a", "b"], [2.5, 2.0])
    memory.record(["a", "b"], [6.0, 2.4])
    memory.record(["a"], [2.8])  # b sent no reply this round: its mean is over its two rounds

    assert memory.mean_ratio("a") == pytest.approx((2.5 + 6.0 + 2.8) / 3, abs=1e-15)
    assert memory.mean_ratio("b") == pytest.approx((2.0 + 2.4) / 2, abs=1e-15)
    assert memory.mean_ratio("never-replied") == 0.0
    assert memory.far(["a", "b", "never-replied"], 3.0).tolist() == [True, False, False]


def test_a_site_far_on_average_stays_out_in_the_round_it_comes_within_the_bound():
    # Execute: two rounds each, without and with the memory
    plain, remembering = optimizer(False), optimizer(True)
    for opt in (plain, remembering):
        opt.aggregate(START, ROUND_1, SIZES, [1] * 6, 1, SITES)
    plain_2 = plain.aggregate(START, ROUND_2, SIZES, [1] * 6, 2, SITES)
    remembering_2 = remembering.aggregate(START, ROUND_2, SIZES, [1] * 6, 2, SITES)

    # Assert: round 2's own bound keeps site-6 (ratio 3.0); its mean ratio 7 keeps it out under the memory
    assert [ratio for ratio, _ in plain.scores] == pytest.approx([5 / 3, 1, 1 / 3, 1 / 3, 1, 3], abs=1e-12)
    assert plain.left_out == [] and remembering.left_out == [5]
    assert remembering.memory.mean_ratio("site-6") == pytest.approx(7.0, abs=1e-12)
    assert plain_2["w"][0] == pytest.approx(23 / 6, abs=1e-12)
    assert remembering_2["w"][0] == pytest.approx(3.0, abs=1e-12)


def test_far_sites_names_the_site_the_memory_keeps_out_and_none_without_the_memory():
    # Execute: the same two rounds as above, with and without the memory
    plain, remembering = optimizer(False), optimizer(True)
    for opt in (plain, remembering):
        for server_round, replies in ((1, ROUND_1), (2, ROUND_2)):
            opt.aggregate(START, replies, SIZES, [1] * 6, server_round, SITES)

    # Assert: site-6's mean ratio 7 > 3 names it (its round-2 ratio, 3.0, alone would not); the others' means are
    # 5/3 (site-1) and less; without the memory no site is named
    assert remembering.far_sites(SITES) == ["site-6"]
    assert plain.far_sites(SITES) == []


def test_an_honest_outlier_within_the_bound_on_average_is_kept_as_without_memory():
    # Prepare: site-6 farther out than the rest but within three median distances every round (ratio 7/3)
    replies = [{"w": np.array([v], dtype=np.float64)} for v in (1.0, 2.0, 3.0, 4.0, 5.0, 7.0)]
    plain, remembering = optimizer(False), optimizer(True)

    # Execute
    results = [(plain.aggregate(START, replies, SIZES, [1] * 6, r, SITES),
                remembering.aggregate(START, replies, SIZES, [1] * 6, r, SITES)) for r in (1, 2, 3)]

    # Assert: the memory changes nothing; the result is FedAvg's mean bit for bit
    assert remembering.left_out == [] and remembering.memory.mean_ratio("site-6") == pytest.approx(7 / 3, abs=1e-12)
    for without, with_memory in results:
        assert without["w"].tobytes() == with_memory["w"].tobytes() == np.array([22 / 6]).tobytes()


def test_a_resumed_optimizer_remembers_the_ratios_and_an_unremembering_one_saves_no_memory():
    # Execute: round 1, a checkpoint, round 2 from it
    first = optimizer(True)
    first.aggregate(START, ROUND_1, SIZES, [1] * 6, 1, SITES)
    resumed = optimizer(True)
    resumed.load_state_dict(first.state_dict())
    straight = first.aggregate(START, ROUND_2, SIZES, [1] * 6, 2, SITES)
    again = resumed.aggregate(START, ROUND_2, SIZES, [1] * 6, 2, SITES)

    # Assert: the same round 2; without the memory, the checkpoint is the moments alone as before
    assert straight["w"].tobytes() == again["w"].tobytes() and resumed.left_out == [5]
    unremembering = optimizer(False)
    unremembering.aggregate(START, ROUND_1, SIZES, [1] * 6, 1, SITES)
    assert MEMORY_KEY in first.state_dict() and unremembering.state_dict() == {}


def test_the_memory_needs_the_sites_and_refuses_a_site_twice_or_a_missing_ratio():
    with pytest.raises(ValueError, match="filter-memory: the filtered mean needs the replies' site names"):
        optimizer(True).aggregate(START, ROUND_1, SIZES, [1] * 6, 1)
    with pytest.raises(ValueError, match="site replied twice"):
        FilterMemory().record(["a", "a"], [1.0, 1.0])
    with pytest.raises(ValueError, match="site 'a' has distance ratio nan"):
        FilterMemory().record(["a"], [float("nan")])


def test_a_round_of_identical_replies_is_not_remembered_and_the_memory_never_leaves_out_every_reply():
    # Prepare: round 1, four of six replies identical (median distance 0: the others' ratios are infinite)
    identical = [{"w": np.array([v], dtype=np.float64)} for v in (1.0, 1.0, 1.0, 1.0, 2.0, 3.0)]
    remembering = optimizer(True)

    # Execute / Assert: the round's own bound leaves out the two that differ; nothing is remembered
    remembering.aggregate(START, identical, SIZES, [1] * 6, 1, SITES)
    assert remembering.left_out == [4, 5] and remembering.memory.state_dict() == {}

    # Two sites replying, both far on average from an earlier round: the round's own decision stands
    remembering.memory.record(["site-1", "site-2"], [9.0, 9.0])
    pair = remembering.aggregate(START, ROUND_1[:2], [1.0, 3.0], [1, 1], 2, ["site-1", "site-2"])
    assert remembering.left_out == [] and pair["w"][0] == pytest.approx((1.0 + 3 * 2.0) / 4, abs=1e-12)
