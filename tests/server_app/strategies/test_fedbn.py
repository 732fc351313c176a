"""FedBNStrategy: shared entries averaged, normalization entries kept per site."""

from __future__ import annotations

import numpy as np
from flwr.app import MessageType
from support.server_fakes import NODE, NODES, EvaluationLog, reply, train_metrics

from app_protocol import records
from fedsm_core.algorithms.baselines.harmofl import AMPLITUDE, BATCHES, FROZEN, AmplitudeSchedule
from server_app.round_plan import RoundPlan
from server_app.strategies.fedavg import FedAvgStrategy
from server_app.strategies.fedbn import FedBNStrategy

LOCAL = {"norm.weight", "norm.running_mean"}


def _weights(conv: float, norm: float) -> dict[str, np.ndarray]:
    return {"conv.weight": np.full(2, conv), "norm.weight": np.full(2, norm), "norm.running_mean": np.full(2, -norm)}


def _train_reply(site: str, weights: dict[str, np.ndarray], num_examples: int):
    return reply(NODE[site], {records.GLOBAL: records.to_record(weights), records.METRICS: train_metrics(num_examples)})


def _strategy() -> FedBNStrategy:
    return FedBNStrategy(_weights(0.0, 1.0), LOCAL, NODES, RoundPlan(5, 1), EvaluationLog())


def _sent(messages) -> dict[int, dict[str, np.ndarray]]:
    return {m.metadata.dst_node_id: records.from_record(m.content[records.GLOBAL]) for m in messages}


def test_shared_entries_are_averaged_and_normalization_entries_never_are():
    # Prepare
    strategy = _strategy()
    replies = [_train_reply("site-a", _weights(1.0, 2.0), 10), _train_reply("site-b", _weights(5.0, 3.0), 30),
               _train_reply("site-c", _weights(3.0, 4.0), 20)]

    # Execute
    strategy.aggregate_train(1, replies)
    sent = _sent(strategy.configure_train(2))

    # Assert: conv = (10 * 1 + 30 * 5 + 20 * 3) / 60; each site gets back its own norm entries
    for site, norm in (("site-a", 2.0), ("site-b", 3.0), ("site-c", 4.0)):
        np.testing.assert_allclose(sent[NODE[site]]["conv.weight"], [220 / 60] * 2)
        np.testing.assert_array_equal(sent[NODE[site]]["norm.weight"], [norm] * 2)
        np.testing.assert_array_equal(sent[NODE[site]]["norm.running_mean"], [-norm] * 2)


def test_a_site_that_misses_a_round_keeps_its_normalization_and_gets_the_new_shared_entries():
    # Prepare
    strategy = _strategy()
    strategy.aggregate_train(1, [_train_reply(n.site_name, _weights(1.0, 7.0 + i), 10) for i, n in enumerate(NODES)])

    # Execute: only site-b replies in round 2
    strategy.aggregate_train(2, [_train_reply("site-b", _weights(9.0, 0.5), 30)])
    sent = _sent(strategy.configure_train(3))

    # Assert
    np.testing.assert_array_equal(sent[NODE["site-a"]]["norm.weight"], [7.0, 7.0])
    np.testing.assert_array_equal(sent[NODE["site-a"]]["conv.weight"], [9.0, 9.0])
    np.testing.assert_array_equal(sent[NODE["site-b"]]["norm.weight"], [0.5, 0.5])
    assert (2, "site-a", "no reply") in strategy.missed


def test_each_site_is_evaluated_with_its_own_model():
    # Prepare
    strategy = _strategy()
    strategy.aggregate_train(1, [_train_reply(n.site_name, _weights(1.0, float(i)), 10) for i, n in enumerate(NODES)])

    # Execute
    messages = strategy.evaluation_messages("test")

    # Assert
    assert all(m.metadata.message_type == MessageType.EVALUATE for m in messages)
    assert all(m.content[records.CONFIG]["split"] == "test" for m in messages)
    sent = _sent(messages)
    assert [float(sent[node.node_id]["norm.weight"][0]) for node in NODES] == [0.0, 1.0, 2.0]


def test_state_dict_round_trip_keeps_every_site_model():
    strategy = _strategy()
    strategy.aggregate_train(1, [_train_reply(n.site_name, _weights(1.0, float(i)), 10) for i, n in enumerate(NODES)])
    restored = _strategy()
    restored.load_state_dict(strategy.state_dict())
    for node in NODES:
        np.testing.assert_array_equal(restored.model_of(node.site_name)["norm.weight"],
                                      strategy.model_of(node.site_name)["norm.weight"])


def _amplitude_weights(amplitude: float, batches: int) -> dict[str, np.ndarray]:
    return {"conv.weight": np.zeros(2, np.float32), AMPLITUDE: np.full((1, 1, 2), amplitude, np.float32),
            FROZEN: np.array(0, np.int64), BATCHES: np.array(batches, np.int64)}


def test_fedavg_fixes_the_global_amplitude_in_the_freeze_round_only():
    # Prepare: v = 0.5, one batch each -> corrected amplitudes 2 * buffer
    plan = RoundPlan(5, 1, amplitude=AmplitudeSchedule(freeze_round=2, decay=0.5))
    strategy = FedAvgStrategy(_amplitude_weights(0.0, 0), NODES, plan, EvaluationLog())
    replies = [_train_reply("site-a", _amplitude_weights(1.0, 1), 10),
               _train_reply("site-b", _amplitude_weights(3.0, 1), 30)]

    # Execute / Assert: round 1 averages the buffers like weights, unfixed
    strategy.aggregate_train(1, replies)
    assert int(strategy.global_weights[FROZEN]) == 0
    np.testing.assert_allclose(strategy.global_weights[AMPLITUDE].ravel(), [2.5, 2.5])
    strategy.aggregate_train(2, replies)
    assert int(strategy.global_weights[FROZEN]) == 1
    np.testing.assert_allclose(strategy.global_weights[AMPLITUDE].ravel(), [5.0, 5.0])  # (10*2 + 30*6) / 40
