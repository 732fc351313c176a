"""FedSMStrategy before and at evaluation: the fitted selector head, gamma chosen on validation, needed models."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import MessageType
from support.server_fakes import (
    LAM,
    NODE,
    NODES,
    SITES,
    EvaluationLog,
    ScriptedGrid,
    error_reply,
    fedsm_strategy,
    reply,
    w,
)

from app_protocol import records
from app_protocol.evaluate_messages import encode_models_reply
from fedsm_core.algorithms.fedsm.fedsm import FedSM
from fedsm_core.algorithms.fedsm.selector_head import CLOSED_BIAS
from fedsm_core.algorithms.robust_aggregation import AggregationSettings
from server_app.round_plan import RoundPlan
from server_app.strategies.fedsm import FedSMStrategy


def _statistics_grid(failing: tuple[str, ...] = (), needs: dict[str, list[int]] | None = None,
                     silent: tuple[str, ...] = ()) -> ScriptedGrid:
    """Answers selector-statistics queries: site k's embeddings are e_k + noise-free spread; ``failing`` sites err,
    ``silent`` sites do not reply.

    Needed-models queries are answered from ``needs`` (site -> model indices); a site not in it errs.
    The grid's ``asked`` and ``asked_models`` list the sites asked each question.
    """
    needs = needs if needs is not None else {site: [index] for index, site in enumerate(SITES)}
    asked: list[str] = []
    asked_models: list[str] = []

    def answer(message):
        assert message.metadata.message_type == MessageType.QUERY
        node = message.metadata.dst_node_id
        site = next(n.site_name for n in NODES if n.node_id == node)
        if message.content[records.CONFIG][records.ASK] == records.ASK_MODELS:
            asked_models.append(site)
            return encode_models_reply(needs[site]) if site in needs else \
                error_reply(node, "no selector", MessageType.QUERY)
        assert message.content[records.CONFIG][records.ASK] == records.SELECTOR_STATISTICS
        asked.append(site)
        if site in silent:
            return None
        if site in failing:
            return error_reply(node, "disk full", MessageType.QUERY)
        # two embeddings per site: mean e_k, spread +-1 along the last axis
        mean = np.eye(3)[SITES.index(site)]
        points = np.stack([mean + [0, 0, 1], mean - [0, 0, 1]])
        sums = {"count": np.array([2.0]), "sum": points.sum(axis=0), "gram": points.T @ points}
        return {records.SELECTOR_STATISTICS: records.to_record(sums)}

    grid = ScriptedGrid(answer)
    grid.asked, grid.asked_models = asked, asked_models
    return grid


def _head_strategy(shrinkage: float | None) -> FedSMStrategy:
    head = {"classifier.weight": np.zeros((3, 3), dtype=np.float32), "classifier.bias": np.zeros(3, np.float32)}
    fedsm = FedSM(SITES, w(0.0, 0.0), head, LAM)
    return FedSMStrategy(fedsm, NODES, RoundPlan(5, 1), EvaluationLog(), gamma=0.5, selector_shrinkage=shrinkage)


def test_before_evaluation_the_selector_head_is_fitted_from_every_sites_statistics():
    # Prepare
    strategy = _head_strategy(shrinkage=0.5)
    grid = _statistics_grid()

    # Execute
    strategy.prepare_evaluation(grid, 3, timeout=1.0, split="val")

    # Assert: a head that sends each site's mean embedding to its own site
    assert sorted(grid.asked) == sorted(SITES)
    weight = strategy.fedsm.selector_weights["classifier.weight"]
    bias = strategy.fedsm.selector_weights["classifier.bias"]
    logits = np.eye(3) @ weight.T + bias
    assert list(logits.argmax(axis=1)) == [0, 1, 2]
    assert {row["stage"] for row in strategy.traffic.rows} == {"selector-head", "needed-models"}


def test_a_site_that_cannot_report_gets_a_closed_route_and_the_others_the_fitted_head():
    # Prepare / Execute: site-b's reply is an error
    strategy = _head_strategy(shrinkage=0.5)
    strategy.prepare_evaluation(_statistics_grid(failing=("site-b",)), 3, timeout=1.0, split="val")

    # Assert: site-a's and site-c's mean embeddings still go to their own sites, nothing goes to site-b
    weight = strategy.fedsm.selector_weights["classifier.weight"]
    bias = strategy.fedsm.selector_weights["classifier.bias"]
    logits = np.eye(3) @ weight.T + bias
    assert logits[0].argmax() == 0 and logits[2].argmax() == 2
    assert not weight[1].any() and bias[1] == np.float32(CLOSED_BIAS)
    # and the run's summary says so
    assert any(note.startswith("selector statistics of site-b missing, rejected or set aside in round(s) 3 "
                               "(last: client error: disk full)") for note in strategy.finish_validation())


def test_a_site_that_does_not_reply_is_named_in_the_summary_with_its_closed_route():
    # Prepare / Execute: site-c sends nothing in round 3 or in round 4
    strategy = _head_strategy(shrinkage=0.5)
    for server_round in (3, 4):
        strategy.prepare_evaluation(_statistics_grid(silent=("site-c",)), server_round, timeout=1.0, split="val")

    # Assert: its route is closed, and the summary names both rounds once each
    weight = strategy.fedsm.selector_weights["classifier.weight"]
    assert not weight[2].any()
    assert strategy.closed_routes == {"site-c": [(3, "no reply"), (4, "no reply")]}
    assert any(note.startswith("selector statistics of site-c missing, rejected or set aside in round(s) 3, 4 "
                               "(last: no reply)")
               for note in strategy.finish_validation())


def test_a_site_the_filter_memory_leaves_out_gets_a_closed_route_and_no_say_in_gamma():
    # Prepare: site-b's global-model updates lay 5 and 4 median distances out (mean 4.5 > filter-factor 3)
    strategy = _head_strategy(shrinkage=0.5)
    strategy.fedsm.global_optimizer.memory.record(SITES, [1.0, 5.0, 0.5])
    strategy.fedsm.global_optimizer.memory.record(SITES, [1.0, 4.0, 0.5])

    # Execute: its statistics are fine, but it is distrusted
    strategy.prepare_evaluation(_statistics_grid(), 3, timeout=1.0, split="val")

    # Assert: nothing goes to site-b's personalized model, and it is out of the gamma choice
    weight = strategy.fedsm.selector_weights["classifier.weight"]
    bias = strategy.fedsm.selector_weights["classifier.bias"]
    assert not weight[1].any() and bias[1] == np.float32(CLOSED_BIAS)
    assert strategy.closed_now == frozenset({"site-b"})
    assert any(note.startswith("selector statistics of site-b missing, rejected or set aside in round(s) 3 "
                               "(last: filter memory: its global-model updates lie 4.50 typical distances out")
               for note in strategy.finish_validation())


def test_without_filter_memory_no_site_is_set_aside():
    # the same distance ratios, but under the plain mean the memory is not consulted
    strategy = _head_strategy(shrinkage=0.5)
    strategy.fedsm.global_optimizer.aggregation = AggregationSettings(name="mean")
    strategy.fedsm.global_optimizer.memory.record(SITES, [1.0, 5.0, 0.5])
    strategy.prepare_evaluation(_statistics_grid(), 3, timeout=1.0, split="val")
    assert strategy.closed_now == frozenset()
    assert strategy.fedsm.selector_weights["classifier.weight"][1].any()


def test_the_trained_head_is_kept_with_fewer_than_two_reports_or_when_the_head_is_not_fitted():
    # two errors of three sites: one site's statistics cannot be fitted, so nothing changes
    strategy = _head_strategy(shrinkage=0.5)
    strategy.prepare_evaluation(_statistics_grid(failing=("site-b", "site-c")), 3, timeout=1.0, split="val")
    np.testing.assert_array_equal(strategy.fedsm.selector_weights["classifier.weight"], np.zeros((3, 3)))
    # selector-head = "trained": no query at all
    strategy = _head_strategy(shrinkage=None)
    grid = _statistics_grid()
    strategy.prepare_evaluation(grid, 3, timeout=1.0, split="val")
    assert grid.asked == []


def _validation_reply(site: str, dice_super: float, sweep: list[float], shares: list[float], images: int):
    metrics = records.to_metrics({"dice-super": dice_super, "share-global": 0.0, "num-images": images,
                                  "dice-super-sweep": sweep, "share-global-sweep": shares})
    return reply(NODE[site], {records.METRICS: metrics}, MessageType.EVALUATE)


def test_validation_reports_the_super_model_at_the_gamma_it_chooses():
    # Prepare: 21 gammas 0.00 .. 1.00. Pooled sweep (a: 1 image, b: 3 images) peaks only at gamma 0.30:
    # a 0.8 there else 0.6; b 0.7 there else 0.5 -> pooled (0.8 + 2.1) / 4 = 0.725 vs 0.55
    log = EvaluationLog()
    fedsm = FedSM(SITES, w(0.0, 0.0), {"s": np.array([0.0])}, LAM)
    strategy = FedSMStrategy(fedsm, NODES, RoundPlan(5, 1), log, gamma=0.5, gamma_selection="validation")
    peak = [i == 6 for i in range(21)]
    sweep_a, sweep_b = [0.8 if p else 0.6 for p in peak], [0.7 if p else 0.5 for p in peak]
    shares = [round(0.05 * i, 2) for i in range(21)]  # share routed to global at each gamma

    # Execute
    strategy.collect_evaluation(5, "val", [_validation_reply("site-a", 0.6, sweep_a, shares, 1),
                                           _validation_reply("site-b", 0.5, sweep_b, shares, 3)])

    # Assert: the round is recorded at gamma 0.30, which becomes the run's gamma
    (server_round, split, per_site), = log.calls
    assert strategy.gamma == 0.3
    assert per_site["site-a"]["dice-super"] == 0.8 and per_site["site-b"]["dice-super"] == 0.7
    assert per_site["site-a"]["share-global"] == 0.3 and per_site["site-a"]["gamma"] == 0.3
    assert "gamma chosen on validation: 0.30" in strategy.finish_validation()


def test_client_average_lets_the_small_site_choose_and_reports_its_curve():
    # Prepare: a (1 image) is best at gamma 0.30 by 0.2; b (3 images) is best elsewhere by 0.1:
    # pooled by images gamma 0.30 gives (0.8 + 1.5) / 4 = 0.575 < (0.6 + 1.8) / 4 = 0.6 elsewhere (gamma 0 wins);
    # client average gamma 0.30 gives (0.8 + 0.5) / 2 = 0.65 > (0.6 + 0.6) / 2 = 0.6
    fedsm = FedSM(SITES, w(0.0, 0.0), {"s": np.array([0.0])}, LAM)
    strategy = FedSMStrategy(fedsm, NODES, RoundPlan(5, 1), EvaluationLog(), gamma=0.5,
                             gamma_selection="client-average")
    peak = [i == 6 for i in range(21)]
    sweep_a, sweep_b = [0.8 if p else 0.6 for p in peak], [0.5 if p else 0.6 for p in peak]
    shares = [0.0] * 21

    # Execute
    strategy.collect_evaluation(5, "val", [_validation_reply("site-a", 0.6, sweep_a, shares, 1),
                                           _validation_reply("site-b", 0.6, sweep_b, shares, 3)])

    # Assert
    assert strategy.gamma == 0.3
    notes = strategy.finish_validation()
    assert any(note.startswith("client-average validation Dice of the super model by gamma: 0.00: 0.6000")
               for note in notes)
    assert "gamma chosen on validation: 0.30" in notes


def test_with_a_fixed_gamma_validation_is_reported_at_it():
    log = EvaluationLog()
    fedsm = FedSM(SITES, w(0.0, 0.0), {"s": np.array([0.0])}, LAM)
    strategy = FedSMStrategy(fedsm, NODES, RoundPlan(5, 1), log, gamma=0.5, gamma_selection="fixed")
    sweep = [0.9 if i == 6 else 0.1 for i in range(21)]

    strategy.collect_evaluation(5, "val", [_validation_reply("site-a", 0.1, sweep, [0.0] * 21, 1)])

    assert strategy.gamma == 0.5
    assert log.calls[0][2]["site-a"]["dice-super"] == 0.1


def _per_model_reply(site: str, dice_global: float, gains: list[list[float]], counts: list[list[float]], images: int):
    """A validation reply with flat sweeps: one gain and count row of 21 gammas per model (3 models)."""
    metrics = records.to_metrics({
        "dice-global": dice_global, "dice-super": 0.0, "share-global": 0.0, "num-images": images,
        "dice-super-sweep": [dice_global] * 21, "share-global-sweep": [1.0] * 21,
        "routing-gain-sweep": [g for row in gains for g in row],
        "routed-count-sweep": [c for row in counts for c in row],
    })
    return reply(NODE[site], {records.METRICS: metrics}, MessageType.EVALUATE)


def test_per_model_gamma_drops_a_personalized_model_that_loses_to_the_global_model():
    # Prepare: a's model gains +0.4 on a's two images at every gamma below 1.0; b's model loses 0.3 on b's one
    # image; c's model was never the argmax. Gains and counts per gamma index (0.00 .. 1.00; at 1.00 none routed).
    log = EvaluationLog()
    fedsm = FedSM(SITES, w(0.0, 0.0), {"s": np.array([0.0])}, LAM)
    strategy = FedSMStrategy(fedsm, NODES, RoundPlan(5, 1), log, gamma=0.5, gamma_selection="per-model")
    below_one = [1.0] * 20 + [0.0]
    zero = [0.0] * 21
    a = _per_model_reply("site-a", 0.5, [[0.4 * x for x in below_one], zero, zero],
                         [[2.0 * x for x in below_one], zero, zero], 2)
    b = _per_model_reply("site-b", 0.6, [zero, [-0.3 * x for x in below_one], zero], [zero, below_one, zero], 1)

    # Execute
    strategy.collect_evaluation(5, "val", [a, b])

    # Assert: a's model always (0.0), b's never (1.0), c's falls back to the pooled choice. The pooled curve is
    # flat here (dice-super-sweep = global everywhere), so that choice is its smallest gamma, 0.0.
    assert strategy.gamma == (0.0, 1.0, 0.0)
    (_, _, per_site), = log.calls
    # a: 0.5 + 0.4 / 2 = 0.7, both images routed; b: its model is dropped, so the global model's 0.6
    assert per_site["site-a"]["dice-super"] == pytest.approx(0.7) and per_site["site-a"]["share-global"] == 0.0
    assert per_site["site-b"]["dice-super"] == pytest.approx(0.6) and per_site["site-b"]["share-global"] == 1.0
    assert per_site["site-b"]["gamma"] == 1.0
    assert "site-a 0.00, site-b 1.00, site-c 0.00" in strategy.finish_validation()[-1]
    content = strategy.evaluation_content("test")
    assert list(content[records.CONFIG]["gamma"]) == [0.0, 1.0, 0.0]


def test_each_site_gets_only_the_personalized_models_its_images_need():
    # Prepare: site-a's images all go to its own model; site-b's to a and c as well; site-c does not answer
    strategy = fedsm_strategy(gamma=0.4)
    grid = _statistics_grid(needs={"site-a": [0], "site-b": [0, 1, 2]})

    # Execute
    strategy.prepare_evaluation(grid, 5, timeout=1.0, split="test")
    messages = {m.metadata.dst_node_id: m.content for m in strategy.evaluation_messages("test")}

    # Assert: no selector-head fit before a test evaluation; a: its model only; b: all three; c: all (no answer)
    assert grid.asked == [] and sorted(grid.asked_models) == sorted(SITES)
    sent = {site: [k for k, model in enumerate(records.models_from_record(
        messages[NODE[site]][records.PERSONALIZED], 3, required=[])) if model is not None] for site in SITES}
    assert sent == {"site-a": [0], "site-b": [0, 1, 2], "site-c": [0, 1, 2]}
    np.testing.assert_array_equal(records.models_from_record(messages[NODE["site-a"]][records.PERSONALIZED], 3,
                                                             required=[0])[0]["w"], [1.0, 1.0])
    assert list(messages[NODE["site-a"]][records.CONFIG]["sent-models"]) == [0]
    assert "sent-models" not in messages[NODE["site-c"]][records.CONFIG]


def test_statistics_whose_count_is_not_the_sites_reported_images_keep_the_trained_head():
    # Prepare: every site reports two embeddings, but the sites reported 10, 30 and 20 images at discovery
    strategy = FedSMStrategy(_head_strategy(0.5).fedsm, NODES, RoundPlan(5, 1), EvaluationLog(), gamma=0.5,
                             selector_shrinkage=0.5, statistics_views=1)

    # Execute
    strategy.prepare_evaluation(_statistics_grid(), 3, timeout=1.0, split="val")

    # Assert: every site's statistics are rejected, so the head stays as trained
    np.testing.assert_array_equal(strategy.fedsm.selector_weights["classifier.weight"], np.zeros((3, 3)))


def test_a_site_with_a_closed_route_takes_no_part_in_choosing_gamma():
    # Prepare: site-a's statistics are rejected, so its route is closed this round. Client average of the sweeps
    # (one gamma index each: 6 is 0.30, 10 is 0.50): a peaks at 0.30 (0.9 else 0.5), b and c at 0.50 (0.7 else
    # 0.6). With a: 0.30 gives (0.9 + 0.6 + 0.6) / 3 = 0.70 > 0.50's (0.5 + 0.7 + 0.7) / 3 = 0.633. Without a: 0.50.
    strategy = _head_strategy(shrinkage=0.5)
    strategy.gamma_selection = "client-average"
    strategy.prepare_evaluation(_statistics_grid(failing=("site-a",)), 3, timeout=1.0, split="val")
    sweep_a = [0.9 if i == 6 else 0.5 for i in range(21)]
    sweep_bc = [0.7 if i == 10 else 0.6 for i in range(21)]
    replies = [_validation_reply("site-a", 0.5, sweep_a, [0.0] * 21, 2),
               _validation_reply("site-b", 0.6, sweep_bc, [0.0] * 21, 2),
               _validation_reply("site-c", 0.6, sweep_bc, [0.0] * 21, 2)]

    # Execute
    strategy.collect_evaluation(3, "val", replies)

    # Assert: b and c choose; a's own Dice is still reported at the chosen gamma
    assert strategy.gamma == 0.5
    (_, _, per_site), = strategy.on_evaluate.calls
    assert per_site["site-a"]["dice-super"] == 0.5 and per_site["site-a"]["gamma"] == 0.5

    # and once every route is open again, a takes part as before
    strategy.prepare_evaluation(_statistics_grid(), 4, timeout=1.0, split="val")
    strategy.collect_evaluation(4, "val", replies)
    assert strategy.gamma == 0.3
