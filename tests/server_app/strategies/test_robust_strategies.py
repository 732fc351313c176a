"""aggregation = trimmed-mean / median / krum reaches every shared model of every strategy (hand-computed values).

One site of three or four sends a wild update with a large claimed size; under
``mean`` it drags each average, under ``median`` it does not.
"""

from __future__ import annotations

import numpy as np
from support.server_fakes import NODE, NODES, EvaluationLog, model_reply, reply, train_metrics, w

from app_protocol import records
from fedsm_core.algorithms.baselines.harmofl import AMPLITUDE, BATCHES, FROZEN, AmplitudeSchedule
from fedsm_core.algorithms.fedsm.fedsm import FedSM, FedSMUpdate
from fedsm_core.algorithms.robust_aggregation import AggregationSettings
from fedsm_core.command_line.preflight import check_run
from server_app.app import describe_rounds, left_out_notes
from server_app.round_plan import RoundPlan
from server_app.strategies.fedavg import FedAvgStrategy, ScaffoldStrategy
from server_app.strategies.fedbn import FedBNStrategy

MEAN = AggregationSettings("mean")
MEDIAN = AggregationSettings("median")
FILTERED = AggregationSettings("filtered-mean")  # with its memory (the default)
EACH_ROUND = AggregationSettings("filtered-mean", filter_memory=False)  # each round judged on its own


def _plan(aggregation: AggregationSettings = MEDIAN, **more) -> RoundPlan:
    return RoundPlan(5, 1, aggregation=aggregation, **more)


def test_fedavg_takes_the_coordinate_median_and_ignores_the_claimed_sizes():
    # Prepare: site-c's update is wild and claims the most images
    replies = [model_reply("site-a", w(1.0, 1.0), 10), model_reply("site-b", w(2.0, 2.0), 30),
               model_reply("site-c", w(100.0, -100.0), 1000)]
    strategy = FedAvgStrategy(w(0.0, 0.0), NODES, _plan(), EvaluationLog())

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert: median(1, 2, 100) = 2 and median(1, 2, -100) = 1; the mean would be (96.1, -95.9)
    np.testing.assert_array_equal(strategy.global_weights["w"], [2.0, 1.0])


def test_scaffolds_control_variate_moves_by_the_median_delta():
    # Prepare: c = 0; deltas 1, 2, 100 from all N = 3 sites
    strategy = ScaffoldStrategy(w(0.0), w(0.0, 0.0), NODES, _plan(), EvaluationLog())
    replies = [model_reply(site, w(1.0, 1.0), 10, **{records.CONTROL_DELTA: w(delta)})
               for site, delta in (("site-a", 1.0), ("site-b", 2.0), ("site-c", 100.0))]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert: c <- 0 + (3 / 3) * median(1, 2, 100) = 2 (the mean: 34.33)
    np.testing.assert_array_equal(strategy.server_control["w"], [2.0])


def test_fedbns_shared_entries_take_the_median_and_local_ones_stay():
    # Prepare
    local = {"norm.weight"}
    strategy = FedBNStrategy({"conv": np.zeros(1), "norm.weight": np.zeros(1)}, local, NODES, _plan(),
                             EvaluationLog())
    replies = [reply(NODE[site], {records.GLOBAL: records.to_record({"conv": np.array([conv]),
                                                                     "norm.weight": np.array([norm])}),
                                  records.METRICS: train_metrics(n)})
               for site, conv, norm, n in (("site-a", 1.0, 7.0, 10), ("site-b", 5.0, 8.0, 30),
                                           ("site-c", 3.0, 9.0, 20))]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert: conv = median(1, 5, 3) = 3 for every site (the weighted mean: 220 / 60); norm entries stay
    for site, norm in (("site-a", 7.0), ("site-b", 8.0), ("site-c", 9.0)):
        np.testing.assert_array_equal(strategy.site_models[site]["conv"], [3.0])
        np.testing.assert_array_equal(strategy.site_models[site]["norm.weight"], [norm])


def test_harmofls_global_amplitude_is_the_median_of_the_sites():
    # Prepare: fixed amplitudes (no bias correction) 1, 3 and 300
    schedule = AmplitudeSchedule(freeze_round=1, decay=0.5, aggregation=MEDIAN)
    sites = [{AMPLITUDE: np.full((1, 2), a), FROZEN: np.array(1), BATCHES: np.array(4)} for a in (1.0, 3.0, 300.0)]

    # Execute
    fixed = schedule.fix(sites, [10, 10, 1000], {"global": sites[0]})

    # Assert
    np.testing.assert_array_equal(fixed["global"][AMPLITUDE], [[3.0, 3.0]])


def test_fedsm_takes_the_median_for_the_global_model_the_selector_and_softpulls_pull():
    # Prepare: four sites, lam = 0.5; site-d is wild in every model and claims 1000 images
    sites = ["site-a", "site-b", "site-c", "site-d"]
    fedsm = FedSM(sites, w(0.0, 0.0), {"s": np.zeros(1)}, 0.5, aggregation=MEDIAN)
    models = {"site-a": ([1.0, 1.0], [0.0, 0.0], 1.0, 10), "site-b": ([2.0, 2.0], [1.0, 10.0], 2.0, 10),
              "site-c": ([3.0, 3.0], [2.0, 20.0], 3.0, 10), "site-d": ([1e3, 1e3], [100.0, -100.0], -50.0, 1000)}
    updates = {site: FedSMUpdate(w(*g), w(*p), {"s": np.array([s])}, {}, n) for site, (g, p, s, n) in models.items()}

    # Execute
    fedsm.aggregate(updates)

    # Assert: global = median of four = mean of the middle two, (2 + 3) / 2; selector (1 + 2) / 2
    np.testing.assert_array_equal(fedsm.global_weights["w"], [2.5, 2.5])
    np.testing.assert_array_equal(fedsm.selector_weights["s"], [1.5])
    # a: 0.5 * [0, 0] + 0.5 * median(b, c, d) = 0.5 * [median(1, 2, 100), median(10, 20, -100)] = [1, 5]
    np.testing.assert_array_equal(fedsm.personalized["site-a"]["w"], [1.0, 5.0])
    # d: 0.5 * [100, -100] + 0.5 * [median(0, 1, 2), median(0, 10, 20)] = [50.5, -45]
    np.testing.assert_array_equal(fedsm.personalized["site-d"]["w"], [50.5, -45.0])


def test_the_mean_is_fedavgs_weighted_average_with_each_claim_capped_at_the_reported_count():
    # Prepare: the sites reported 10, 30 and 20 training images at discovery; site-c claims 1000
    replies = [model_reply("site-a", w(1.0, 1.0), 10), model_reply("site-b", w(2.0, 2.0), 30),
               model_reply("site-c", w(100.0, -100.0), 1000)]
    strategy = FedAvgStrategy(w(0.0, 0.0), NODES, RoundPlan(5, 1, aggregation=MEAN), EvaluationLog())

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert: weighted by 10, 30 and 20 (not 1000), and the cap is recorded
    np.testing.assert_allclose(strategy.global_weights["w"], [(10 + 60 + 2000) / 60, (10 + 60 - 2000) / 60])
    assert strategy.capped == [(1, "site-c", 1000, 20)]


def test_krum_needs_enough_sites_and_the_check_runs_before_the_run():
    # 6 sites: FedAvg's Krum with f = 1 needs 5; FedSM's SoftPull needs 6 (Krum over the 5 others)
    assert check_run({"strategy": "fedavg", "aggregation": "krum", "krum-byzantine": 1}).ok
    assert check_run({"strategy": "fedsm", "aggregation": "krum", "krum-byzantine": 1}).ok
    problems = check_run({"strategy": "fedsm", "aggregation": "krum", "krum-byzantine": 2}).problems
    assert any("needs at least 8 sites, the run has 6" in problem for problem in problems)


def _three_replies(wild: dict[str, np.ndarray]) -> list:
    return [model_reply("site-a", w(1.0, 1.0), 10), model_reply("site-b", w(2.0, 2.0), 30),
            model_reply("site-c", wild, 20)]


def test_the_filtered_mean_names_the_site_it_leaves_out_in_its_state_and_the_summary():
    # Prepare: site-c is far out in rounds 1 and 2 (median (2, 1): distances 1, 1, 140.7 > 3 * 1),
    # ordinary in round 3 (median (1.5, 1.5): distances 0.71, 0.71, 0 <= 3 * 0.71)
    strategy = FedAvgStrategy(w(0.0, 0.0), NODES, _plan(EACH_ROUND), EvaluationLog())
    wild = {1: w(100.0, -100.0), 2: w(100.0, -100.0), 3: w(1.5, 1.5)}

    # Execute
    for server_round in (1, 2, 3):
        strategy.aggregate_train(server_round, _three_replies(wild[server_round]))
        if server_round == 1:
            first = strategy.global_weights["w"].copy()

    # Assert: round 1 averaged a and b only, (10 * 1 + 30 * 2) / 40 = 1.75; every round is on record
    np.testing.assert_array_equal(first, [1.75, 1.75])
    assert strategy.left_out == [(1, "site-c", "global model"), (2, "site-c", "global model")]
    assert left_out_notes(strategy.left_out) == ["filtered mean: site-c's global model left out in 2 round(s): 1-2"]
    resumed = FedAvgStrategy(w(0.0, 0.0), NODES, _plan(EACH_ROUND), EvaluationLog())
    resumed.load_state_dict(strategy.state_dict())
    assert resumed.left_out == strategy.left_out


def test_the_filtered_means_memory_keeps_a_site_out_in_its_ordinary_round_also_after_a_resume():
    # Prepare: as above, site-c far out in rounds 1 and 2 (ratio 140.7) and ordinary in round 3 (ratio 0);
    # its mean ratio after round 3 is (140.7 + 140.7 + 0) / 3 > 3
    wild = {1: w(100.0, -100.0), 2: w(100.0, -100.0), 3: w(1.5, 1.5)}
    strategy = FedAvgStrategy(w(0.0, 0.0), NODES, _plan(FILTERED), EvaluationLog())
    for server_round in (1, 2):
        strategy.aggregate_train(server_round, _three_replies(wild[server_round]))
    resumed = FedAvgStrategy(w(0.0, 0.0), NODES, _plan(FILTERED), EvaluationLog())
    resumed.load_state_dict(strategy.state_dict())

    # Execute: round 3 in the running strategy and in one resumed from its state
    for each in (strategy, resumed):
        each.aggregate_train(3, _three_replies(wild[3]))

    # Assert: site-c stays out in round 3 in both: the average of a and b, (10 * 1 + 30 * 2) / 40 = 1.75
    for each in (strategy, resumed):
        assert each.left_out[-1] == (3, "site-c", "global model")
        np.testing.assert_array_equal(each.global_weights["w"], [1.75, 1.75])


def test_the_mean_leaves_nothing_out_and_rounds_are_described_as_spans():
    strategy = FedAvgStrategy(w(0.0, 0.0), NODES, _plan(AggregationSettings("mean")), EvaluationLog())
    strategy.aggregate_train(1, _three_replies(w(100.0, -100.0)))
    assert strategy.left_out == [] and left_out_notes([]) == []
    assert describe_rounds([7, 1, 2, 3, 5, 8, 2]) == "1-3, 5, 7-8"


def test_fedsms_global_optimizer_names_the_reply_the_filtered_mean_left_out():
    # Prepare: four sites; site-d's global model is far out
    sites = ["site-a", "site-b", "site-c", "site-d"]
    fedsm = FedSM(sites, w(0.0, 0.0), {"s": np.zeros(1)}, 0.5, aggregation=FILTERED)
    models = {"site-a": [1.0, 1.0], "site-b": [2.0, 2.0], "site-c": [3.0, 3.0], "site-d": [1e3, -1e3]}
    updates = {site: FedSMUpdate(w(*g), w(*g), {"s": np.array([1.0])}, {}, 10) for site, g in models.items()}

    # Execute
    fedsm.aggregate(updates)

    # Assert: index 3 of the replies (site-d) left out; the global model is the mean of a, b, c
    assert fedsm.global_optimizer.left_out == [3]
    np.testing.assert_array_equal(fedsm.global_weights["w"], [2.0, 2.0])
