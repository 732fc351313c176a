"""FedAvgStrategy and ScaffoldStrategy: weighted averaging, control variates, server optimizer and state."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import MessageType
from support.server_fakes import NODE, NODES, EvaluationLog, fedavg_strategy, model_reply, reply, w

from app_protocol import records
from fedsm_core.algorithms.aggregation import weighted_average
from fedsm_core.algorithms.server_optimizer import ServerOptimizerSettings
from fedsm_core.run_files.checkpoint import load_checkpoint, save_checkpoint
from server_app.round_plan import RoundPlan
from server_app.strategies.fedavg import FedAvgStrategy, ScaffoldStrategy


def _scaffold() -> ScaffoldStrategy:
    return ScaffoldStrategy(w(0.0, 0.0), w(0.0, 0.0), NODES, RoundPlan(5, 1), EvaluationLog())


def test_one_round_of_fedavg_equals_weighted_average():
    # Prepare
    rng = np.random.default_rng(0)
    initial = {"conv.weight": np.zeros((2, 3), np.float32), "conv.bias": np.zeros(3, np.float32)}
    site_weights = [{key: rng.normal(size=value.shape).astype(np.float32) for key, value in initial.items()}
                    for _ in NODES]
    sizes = [7, 11, 3]
    strategy = fedavg_strategy(initial)
    replies = [model_reply(node.site_name, weights, n) for node, weights, n in zip(NODES, site_weights, sizes,
                                                                                    strict=True)]

    # Execute
    arrays, metrics = strategy.aggregate_train(1, replies)

    # Assert
    expected = weighted_average(site_weights, sizes)
    assert set(strategy.global_weights) == set(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(strategy.global_weights[key], value)
        assert strategy.global_weights[key].dtype == np.float32
        assert arrays is None
    assert metrics["num-examples"] == pytest.approx((7 + 11 + 3) / 3)
    assert strategy.missed == []


def test_configure_train_sends_the_global_model_and_round_to_every_node():
    # Prepare
    strategy = fedavg_strategy(w(3.0, 4.0))

    # Execute
    messages = list(strategy.configure_train(6))

    # Assert
    assert sorted(m.metadata.dst_node_id for m in messages) == [101, 102, 103]
    for message in messages:
        assert message.metadata.message_type == MessageType.TRAIN
        np.testing.assert_array_equal(records.from_record(message.content[records.GLOBAL])["w"], [3.0, 4.0])
        assert message.content[records.CONFIG]["server-round"] == 6
        assert records.SERVER_CONTROL not in message.content


def test_scaffold_moves_the_server_control_by_the_mean_delta_over_all_sites():
    # Prepare
    strategy = _scaffold()
    replies = [
        model_reply("site-a", w(1.0, 2.0), 10, **{records.CONTROL_DELTA: w(3.0, 6.0)}),
        model_reply("site-b", w(5.0, 6.0), 30, **{records.CONTROL_DELTA: w(0.0, 3.0)}),
    ]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert: c = 0 + ([3, 6] + [0, 3]) / N with N = 3 sites, not 2 replies
    np.testing.assert_array_equal(strategy.server_control["w"], [1.0, 3.0])
    np.testing.assert_array_equal(strategy.global_weights["w"], [4.0, 5.0])
    assert strategy.missed == [(1, "site-c", "no reply")]


def test_scaffold_rejects_a_reply_with_a_nan_control_delta():
    # Prepare
    strategy = _scaffold()
    replies = [
        model_reply("site-a", w(1.0, 2.0), 10, **{records.CONTROL_DELTA: w(3.0, 6.0)}),
        model_reply("site-b", w(5.0, 6.0), 30, **{records.CONTROL_DELTA: w(np.nan, 3.0)}),
    ]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert: only site-a counts: global [1, 2], c = [3, 6] / 3
    np.testing.assert_array_equal(strategy.global_weights["w"], [1.0, 2.0])
    np.testing.assert_array_equal(strategy.server_control["w"], [1.0, 2.0])
    reasons = {site: why for _, site, why in strategy.missed}
    assert "non-finite" in reasons["site-b"] and records.CONTROL_DELTA in reasons["site-b"]


def test_scaffold_configure_train_carries_the_server_control():
    # Prepare
    strategy = _scaffold()
    strategy.server_control = w(0.5, -0.5)

    # Execute
    messages = list(strategy.configure_train(1))

    # Assert
    assert len(messages) == 3
    for message in messages:
        np.testing.assert_array_equal(records.from_record(message.content[records.SERVER_CONTROL])["w"], [0.5, -0.5])


def _scaffold_after_one_round() -> ScaffoldStrategy:
    strategy = _scaffold()
    strategy.aggregate_train(1, [
        model_reply("site-a", w(1.0, 2.0), 10, **{records.CONTROL_DELTA: w(3.0, 6.0)}),
        model_reply("site-b", w(5.0, 6.0), 30, **{records.CONTROL_DELTA: w(0.0, 3.0)}),
    ])
    return strategy


def test_scaffold_state_dict_round_trip_restores_global_and_server_control():
    # Prepare
    strategy = _scaffold_after_one_round()
    fresh = _scaffold()

    # Execute
    fresh.load_state_dict(strategy.state_dict())

    # Assert
    np.testing.assert_array_equal(fresh.global_weights["w"], [4.0, 5.0])
    np.testing.assert_array_equal(fresh.server_control["w"], [1.0, 3.0])
    assert fresh.missed == [(1, "site-c", "no reply")]


def test_scaffold_state_survives_a_checkpoint_file(tmp_path):
    # Prepare
    strategy = _scaffold_after_one_round()
    path = save_checkpoint(tmp_path / "checkpoint.pt", 1, {}, [n.site_name for n in NODES], strategy.name,
                           strategy.state_dict(), [])
    fresh = _scaffold()

    # Execute
    fresh.load_state_dict(load_checkpoint(path)["state"])

    # Assert
    np.testing.assert_array_equal(fresh.global_weights["w"], [4.0, 5.0])
    np.testing.assert_array_equal(fresh.server_control["w"], [1.0, 3.0])
    assert fresh.server_control["w"].dtype == strategy.server_control["w"].dtype
    assert fresh.missed == [(1, "site-c", "no reply")]
    # the resumed strategy continues exactly as the original one
    round_two = [model_reply("site-c", w(2.0, 2.0), 20, **{records.CONTROL_DELTA: w(3.0, 3.0)})]
    strategy.aggregate_train(2, round_two)
    fresh.aggregate_train(2, round_two)
    np.testing.assert_array_equal(fresh.global_weights["w"], strategy.global_weights["w"])
    np.testing.assert_array_equal(fresh.server_control["w"], [2.0, 4.0])
    np.testing.assert_array_equal(strategy.server_control["w"], [2.0, 4.0])
    assert fresh.missed == strategy.missed


@pytest.mark.parametrize("metrics", [{"loss": 1.0}, {"loss": 1.0, "num-examples": -3.0},
                                     {"loss": 1.0, "num-examples": float("nan")}])
def test_a_reply_without_a_valid_num_examples_is_rejected(metrics):
    # Prepare
    strategy = fedavg_strategy()
    bad = reply(NODE["site-c"], {records.GLOBAL: records.to_record(w(9.0, 9.0)),
                                 records.METRICS: records.to_metrics(metrics)})
    replies = [model_reply("site-a", w(1.0, 2.0), 10), model_reply("site-b", w(5.0, 6.0), 30), bad]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert
    np.testing.assert_array_equal(strategy.global_weights["w"], [4.0, 5.0])
    assert [(r, s) for r, s, _ in strategy.missed] == [(1, "site-c")]
    assert "malformed" in strategy.missed[0][2] and "num-examples" in strategy.missed[0][2]


def test_a_server_optimizer_steps_from_the_average_and_its_moments_survive_a_checkpoint():
    # Prepare: FedAvgM with lr 0.5, momentum 0.9; every site sends the same model, so the average is known
    settings = ServerOptimizerSettings("momentum", lr=0.5, momentum=0.9)

    def strategy() -> FedAvgStrategy:
        return FedAvgStrategy({"w": np.array([1.0, 1.0])}, NODES, RoundPlan(5, 1), EvaluationLog(),
                              server_optimizer=settings)

    def round_of(target: float, server_round: int, on: FedAvgStrategy) -> None:
        on.aggregate_train(server_round, [model_reply(node.site_name, {"w": np.array([target, target])}, 2)
                                          for node in NODES])

    first, resumed = strategy(), strategy()

    # Execute: round 1 on one strategy, its state into a fresh one, round 2 on both
    round_of(2.0, 1, first)
    resumed.load_state_dict(first.state_dict())
    round_of(2.5, 2, first)
    round_of(2.5, 2, resumed)

    # Assert, by hand: w1 = 1 + 0.5 * 1 = 1.5; m2 = 0.9 * (-1) + (1.5 - 2.5) = -1.9, w2 = 1.5 + 0.95 = 2.45
    np.testing.assert_allclose(first.global_weights["w"], [2.45, 2.45], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(resumed.global_weights["w"], first.global_weights["w"])


def test_under_fednova_a_reply_without_local_steps_is_rejected_and_the_others_are_averaged():
    # Prepare: site-a took 2 steps, site-b 6, site-c reports none
    strategy = FedAvgStrategy({"w": np.array([0.0])}, NODES, RoundPlan(5, 1), EvaluationLog(),
                              server_optimizer=ServerOptimizerSettings(step_normalization="fednova"))
    replies = [reply(NODE[site], {records.GLOBAL: records.to_record({"w": np.array([target])}),
                                  records.METRICS: records.to_metrics(metrics)})
               for site, target, metrics in [("site-a", 4.0, {"num-examples": 1, "steps": 2}),
                                             ("site-b", 3.0, {"num-examples": 3, "steps": 6}),
                                             ("site-c", 9.0, {"num-examples": 3})]]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert: the hand-computed FedNova value of the two valid replies (tests/algorithms/test_aggregation.py)
    assert strategy.global_weights["w"][0] == pytest.approx(4.375, abs=1e-15)
    assert [(site, reason.split(":")[0]) for _, site, reason in strategy.missed] == [("site-c", "malformed reply")]


@pytest.mark.parametrize(("weighting", "expected"), [("size", [4.0, 5.25]), ("equal", [3.0, 4.5])])
def test_averaged_optimizer_state_is_the_sites_average_and_goes_out_with_the_next_model(weighting, expected):
    # Prepare: the state starts as a fresh Adam's (zeros); sites of 10 and 30 images reply with theirs
    strategy = FedAvgStrategy(w(0.0, 0.0), NODES, RoundPlan(5, 1), EvaluationLog(),
                              server_optimizer=ServerOptimizerSettings(site_weighting=weighting),
                              optimizer_state=w(0.0, 0.0))
    first = list(strategy.configure_train(1))[0]
    replies = [model_reply("site-a", w(1.0, 2.0), 10, **{records.OPTIMIZER_STATE: w(1.0, 3.0)}),
               model_reply("site-b", w(5.0, 6.0), 30, **{records.OPTIMIZER_STATE: w(5.0, 6.0)})]

    # Execute
    strategy.aggregate_train(1, replies)
    second = list(strategy.configure_train(2))[0]
    restored = FedAvgStrategy(w(0.0, 0.0), NODES, RoundPlan(5, 1), EvaluationLog(), optimizer_state=w(0.0, 0.0))
    restored.load_state_dict(strategy.state_dict())

    # Assert: by size (10 [1, 3] + 30 [5, 6]) / 40 = [4, 5.25]; equally ([1, 3] + [5, 6]) / 2 = [3, 4.5]
    np.testing.assert_array_equal(records.from_record(first.content[records.OPTIMIZER_STATE])["w"], [0.0, 0.0])
    np.testing.assert_allclose(records.from_record(second.content[records.OPTIMIZER_STATE])["w"], expected)
    np.testing.assert_allclose(restored.optimizer_state["w"], expected)


def test_a_reply_without_the_averaged_optimizer_state_is_rejected():
    # Prepare
    strategy = FedAvgStrategy(w(0.0, 0.0), NODES, RoundPlan(5, 1), EvaluationLog(), optimizer_state=w(0.0, 0.0))

    # Execute
    strategy.aggregate_train(1, [model_reply("site-a", w(1.0, 2.0), 10, **{records.OPTIMIZER_STATE: w(1.0, 3.0)}),
                                 model_reply("site-b", w(5.0, 6.0), 30)])

    # Assert
    np.testing.assert_array_equal(strategy.global_weights["w"], [1.0, 2.0])
    np.testing.assert_array_equal(strategy.optimizer_state["w"], [1.0, 3.0])
    assert "site-b" in {site for _, site, _ in strategy.missed}
