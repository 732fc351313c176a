"""FedAvgStrategy's reply checks: what it rejects, what it records as missed, when a round stops the run."""

from __future__ import annotations

import numpy as np
import pytest
from support.server_fakes import NODE, error_reply, fedavg_strategy, model_reply, reply, train_metrics, w

from app_protocol import records


def test_a_reply_with_nan_is_rejected_and_the_others_are_averaged_by_size():
    # Prepare
    strategy = fedavg_strategy()
    replies = [
        model_reply("site-a", w(1.0, 2.0), 10),
        model_reply("site-b", w(5.0, 6.0), 30),
        model_reply("site-c", w(np.nan, 1.0), 20),
    ]

    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)

    # Assert: (10 * [1, 2] + 30 * [5, 6]) / 40 = [4, 5]; site-c's 20 examples do not count
    np.testing.assert_array_equal(strategy.global_weights["w"], [4.0, 5.0])
    assert strategy.global_weights["w"].dtype == np.float64
    assert arrays is None  # the strategy keeps the model; nothing is serialized for Flower to drop
    assert len(strategy.missed) == 1
    server_round, site, reason = strategy.missed[0]
    assert (server_round, site) == (1, "site-c")
    assert "non-finite" in reason and "'w'" in reason


def test_an_infinite_value_is_rejected_like_nan():
    # Prepare
    strategy = fedavg_strategy()
    replies = [model_reply("site-a", w(1.0, 2.0), 10), model_reply("site-b", w(np.inf, 6.0), 30),
               model_reply("site-c", w(3.0, 4.0), 20)]

    # Execute
    strategy.aggregate_train(2, replies)

    # Assert: (10 * [1, 2] + 20 * [3, 4]) / 30 = [7 / 3, 10 / 3]
    np.testing.assert_allclose(strategy.global_weights["w"], [7 / 3, 10 / 3], rtol=1e-15)
    assert [(r, s) for r, s, _ in strategy.missed] == [(2, "site-b")]
    assert "non-finite" in strategy.missed[0][2]


def test_a_client_error_and_a_wrong_shape_are_rejected():
    # Prepare
    strategy = fedavg_strategy()
    replies = [
        model_reply("site-a", w(1.0, 2.0), 10),
        error_reply(NODE["site-b"], "CUDA out of memory"),
        model_reply("site-c", w(1.0, 2.0, 3.0), 20),
    ]

    # Execute
    strategy.aggregate_train(3, replies)

    # Assert: only site-a counts
    np.testing.assert_array_equal(strategy.global_weights["w"], [1.0, 2.0])
    missed = {site: (r, why) for r, site, why in strategy.missed}
    assert set(missed) == {"site-b", "site-c"}
    assert missed["site-b"][0] == 3 and "client error" in missed["site-b"][1]
    assert "CUDA out of memory" in missed["site-b"][1]
    assert missed["site-c"][0] == 3 and "malformed" in missed["site-c"][1]
    assert "(3,)" in missed["site-c"][1] and "(2,)" in missed["site-c"][1]


def test_a_reply_without_the_model_record_is_rejected():
    # Prepare
    strategy = fedavg_strategy()
    replies = [model_reply("site-a", w(1.0, 2.0), 10), model_reply("site-b", w(5.0, 6.0), 30),
               reply(NODE["site-c"], {records.METRICS: train_metrics(20)})]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert
    np.testing.assert_array_equal(strategy.global_weights["w"], [4.0, 5.0])
    assert [(r, s) for r, s, _ in strategy.missed] == [(1, "site-c")]
    assert "malformed" in strategy.missed[0][2] and records.GLOBAL in strategy.missed[0][2]


def test_a_reply_with_a_renamed_array_is_rejected():
    # Prepare
    strategy = fedavg_strategy()
    replies = [model_reply("site-a", w(1.0, 2.0), 10), model_reply("site-b", {"v": np.array([5.0, 6.0])}, 30)]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert
    np.testing.assert_array_equal(strategy.global_weights["w"], [1.0, 2.0])
    rejected = [(s, why) for _, s, why in strategy.missed if why != "no reply"]
    assert len(rejected) == 1 and rejected[0][0] == "site-b"
    assert "missing ['w']" in rejected[0][1] and "unexpected ['v']" in rejected[0][1]


def test_a_node_without_a_reply_is_recorded_as_no_reply():
    # Prepare
    strategy = fedavg_strategy()
    replies = [model_reply("site-a", w(1.0, 2.0), 10), model_reply("site-b", w(5.0, 6.0), 30)]

    # Execute
    strategy.aggregate_train(4, replies)

    # Assert
    np.testing.assert_array_equal(strategy.global_weights["w"], [4.0, 5.0])
    assert strategy.missed == [(4, "site-c", "no reply")]


def test_a_rejected_site_is_not_also_recorded_as_absent():
    # Prepare
    strategy = fedavg_strategy()
    replies = [model_reply("site-a", w(1.0, 2.0), 10), error_reply(NODE["site-b"], "killed")]

    # Execute
    strategy.aggregate_train(2, replies)

    # Assert: one entry per site and round
    assert [(r, s) for r, s, _ in strategy.missed] == [(2, "site-b"), (2, "site-c")]
    assert strategy.missed[1][2] == "no reply"


def test_fewer_valid_replies_than_min_replies_stop_the_run_and_keep_the_model():
    # Prepare
    strategy = fedavg_strategy(w(7.0, 7.0), min_replies=3)
    replies = [model_reply("site-a", w(1.0, 2.0), 10), model_reply("site-b", w(5.0, 6.0), 30),
               model_reply("site-c", w(np.nan, 0.0), 20)]

    # Execute / Assert
    with pytest.raises(RuntimeError, match="min-replies") as raised:
        strategy.aggregate_train(5, replies)
    assert "round 5" in str(raised.value) and "2 valid" in str(raised.value)
    np.testing.assert_array_equal(strategy.global_weights["w"], [7.0, 7.0])
    assert [(r, s) for r, s, _ in strategy.missed] == [(5, "site-c")]


def test_exactly_min_replies_valid_replies_are_enough():
    # Prepare
    strategy = fedavg_strategy(min_replies=2)
    replies = [model_reply("site-a", w(1.0, 2.0), 10), model_reply("site-b", w(5.0, 6.0), 30)]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert
    np.testing.assert_array_equal(strategy.global_weights["w"], [4.0, 5.0])


def test_no_valid_reply_at_all_stops_the_run():
    # Prepare
    strategy = fedavg_strategy(w(7.0, 7.0))

    # Execute / Assert
    with pytest.raises(RuntimeError, match="min-replies"):
        strategy.aggregate_train(1, [error_reply(NODE["site-a"], "boom")])
    np.testing.assert_array_equal(strategy.global_weights["w"], [7.0, 7.0])
    assert len(strategy.missed) == 3
