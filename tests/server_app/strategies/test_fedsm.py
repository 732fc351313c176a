"""FedSMStrategy: per-site messages, FedSM aggregation of validated replies, checkpointed state."""

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
    error_reply,
    fedsm_strategy,
    reply,
    train_metrics,
    w,
)

from app_protocol import records
from fedsm_core.algorithms.fedsm.fedsm import FedSM
from fedsm_core.algorithms.fedsm.softpull import soft_pull
from fedsm_core.run_files.checkpoint import load_checkpoint, save_checkpoint
from server_app.round_plan import RoundPlan
from server_app.strategies.fedsm import FedSMStrategy
from server_app.strategies.fedsm_extra import FedSMExtraStrategy


def _train_reply(site: str, glob, personal, selector: float, moment: float, num_examples: int):
    return reply(NODE[site], {
        records.GLOBAL: records.to_record(glob),
        records.PERSONAL: records.to_record(personal),
        records.SELECTOR: records.to_record({"s": np.array([selector])}),
        records.SELECTOR_OPTIMIZER: records.to_record({"s/exp_avg": np.array([moment])}),
        records.METRICS: train_metrics(num_examples),
    })


def _replies_of_a_and_b():
    return [
        _train_reply("site-a", w(1.0, 1.0), w(4.0, 8.0), 2.0, 1.0, 10),
        _train_reply("site-b", w(5.0, 9.0), w(8.0, 0.0), 4.0, 3.0, 30),
    ]


@pytest.mark.parametrize("site_c", ["absent", "nan", "error", "wrong shape"])
def test_a_site_without_a_valid_reply_keeps_its_personalized_model(site_c):
    # Prepare
    strategy = fedsm_strategy()
    replies = _replies_of_a_and_b()
    if site_c == "nan":
        replies.append(_train_reply("site-c", w(0.0, 0.0), w(np.nan, 1.0), 0.0, 0.0, 20))
    elif site_c == "error":
        replies.append(error_reply(NODE["site-c"], "out of memory"))
    elif site_c == "wrong shape":
        replies.append(_train_reply("site-c", w(0.0, 0.0), w(1.0, 1.0, 1.0), 0.0, 0.0, 20))

    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)

    # Assert
    personalized = strategy.fedsm.personalized
    # site-c did not count: its model stays, and enters the others' SoftPull unchanged
    np.testing.assert_array_equal(personalized["site-c"]["w"], [0.0, 4.0])
    # a: 0.5 * [4, 8] + 0.25 * ([8, 0] + [0, 4]) = [4, 5]
    np.testing.assert_array_equal(personalized["site-a"]["w"], [4.0, 5.0])
    # b: 0.5 * [8, 0] + 0.25 * ([4, 8] + [0, 4]) = [5, 3]
    np.testing.assert_array_equal(personalized["site-b"]["w"], [5.0, 3.0])
    pulled = soft_pull({"site-a": w(4.0, 8.0), "site-b": w(8.0, 0.0), "site-c": w(0.0, 4.0)}, LAM)
    for site in ("site-a", "site-b"):
        np.testing.assert_array_equal(personalized[site]["w"], pulled[site]["w"])
    # global: (10 * [1, 1] + 30 * [5, 9]) / 40 = [4, 7]; selector and moments averaged equally
    np.testing.assert_array_equal(strategy.fedsm.global_weights["w"], [4.0, 7.0])
    assert arrays is None
    np.testing.assert_array_equal(strategy.fedsm.selector_weights["s"], [3.0])
    np.testing.assert_array_equal(strategy.fedsm.selector_optimizer["s/exp_avg"], [2.0])
    assert [(r, s) for r, s, _ in strategy.missed] == [(1, "site-c")]
    reason = strategy.missed[0][2]
    expected_reason = {"absent": "no reply", "nan": "non-finite", "error": "client error",
                       "wrong shape": "malformed"}[site_c]
    assert expected_reason in reason


def test_all_sites_replying_pull_every_personalized_model():
    # Prepare
    strategy = fedsm_strategy()
    replies = [*_replies_of_a_and_b(), _train_reply("site-c", w(2.0, 2.0), w(4.0, 4.0), 6.0, 5.0, 20)]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert
    personalized = strategy.fedsm.personalized
    # a: 0.5 * [4, 8] + 0.25 * ([8, 0] + [4, 4]) = [5, 5]
    np.testing.assert_array_equal(personalized["site-a"]["w"], [5.0, 5.0])
    # b: 0.5 * [8, 0] + 0.25 * ([4, 8] + [4, 4]) = [6, 3]
    np.testing.assert_array_equal(personalized["site-b"]["w"], [6.0, 3.0])
    # c: 0.5 * [4, 4] + 0.25 * ([4, 8] + [8, 0]) = [5, 4]
    np.testing.assert_array_equal(personalized["site-c"]["w"], [5.0, 4.0])
    # global: (10 * [1, 1] + 30 * [5, 9] + 20 * [2, 2]) / 60 = [10 / 3, 16 / 3]
    np.testing.assert_allclose(strategy.fedsm.global_weights["w"], [10 / 3, 16 / 3], rtol=1e-15)
    np.testing.assert_array_equal(strategy.fedsm.selector_weights["s"], [4.0])
    assert strategy.missed == []


def test_a_nan_in_the_selector_rejects_the_whole_reply():
    # Prepare
    strategy = fedsm_strategy()
    replies = [*_replies_of_a_and_b(), _train_reply("site-c", w(2.0, 2.0), w(4.0, 4.0), np.nan, 5.0, 40)]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert: as if site-c had not replied
    np.testing.assert_array_equal(strategy.fedsm.global_weights["w"], [4.0, 7.0])
    np.testing.assert_array_equal(strategy.fedsm.personalized["site-c"]["w"], [0.0, 4.0])
    np.testing.assert_array_equal(strategy.fedsm.selector_weights["s"], [3.0])
    assert [(r, s) for r, s, _ in strategy.missed] == [(1, "site-c")]
    assert records.SELECTOR in strategy.missed[0][2]


def test_fewer_valid_replies_than_min_replies_leave_the_super_model_unchanged():
    # Prepare
    strategy = fedsm_strategy(min_replies=3)

    # Execute / Assert
    with pytest.raises(RuntimeError, match="min-replies"):
        strategy.aggregate_train(2, _replies_of_a_and_b())
    np.testing.assert_array_equal(strategy.fedsm.global_weights["w"], [0.0, 0.0])
    np.testing.assert_array_equal(strategy.fedsm.personalized["site-a"]["w"], [1.0, 1.0])
    np.testing.assert_array_equal(strategy.fedsm.personalized["site-b"]["w"], [2.0, 2.0])
    assert strategy.fedsm.selector_optimizer == {}
    assert strategy.missed == [(2, "site-c", "no reply")]


def test_configure_train_sends_each_node_its_own_personalized_model():
    # Prepare
    strategy = fedsm_strategy()
    strategy.fedsm.global_weights = w(9.0, 9.0)
    strategy.fedsm.selector_optimizer = {"s/exp_avg": np.array([0.25])}

    # Execute
    messages = list(strategy.configure_train(3))

    # Assert
    own = {101: [1.0, 1.0], 102: [2.0, 2.0], 103: [0.0, 4.0]}
    assert sorted(m.metadata.dst_node_id for m in messages) == sorted(own)
    for message in messages:
        content = message.content
        assert message.metadata.message_type == MessageType.TRAIN
        personal = records.from_record(content[records.PERSONAL])
        np.testing.assert_array_equal(personal["w"], own[message.metadata.dst_node_id])
        np.testing.assert_array_equal(records.from_record(content[records.GLOBAL])["w"], [9.0, 9.0])
        np.testing.assert_array_equal(records.from_record(content[records.SELECTOR])["s"], [0.0])
        np.testing.assert_array_equal(records.from_record(content[records.SELECTOR_OPTIMIZER])["s/exp_avg"], [0.25])
        assert content[records.CONFIG]["server-round"] == 3
        assert records.PERSONALIZED not in content  # the other sites' models do not travel


def _trainedfedsm_strategy() -> FedSMStrategy:
    """A strategy after one training round (site-c absent) and one evaluation."""
    strategy = fedsm_strategy(gamma=0.3)
    strategy.aggregate_train(1, _replies_of_a_and_b())
    evaluations = [reply(node.node_id, {records.METRICS: records.to_metrics(
        {"dice": 0.5 + node.site_index / 10, "num-images": 2 + node.site_index,
         "dice-super-sweep": [0.25, 0.5 + node.site_index / 4]})}, MessageType.EVALUATE) for node in NODES]
    strategy.aggregate_evaluate(1, evaluations)
    return strategy


def _assert_same_state(restored: FedSMStrategy, original: FedSMStrategy) -> None:
    pairs = [(restored.fedsm.global_weights, original.fedsm.global_weights),
             (restored.fedsm.selector_weights, original.fedsm.selector_weights),
             (restored.fedsm.selector_optimizer, original.fedsm.selector_optimizer),
             *[(restored.fedsm.personalized[s], original.fedsm.personalized[s]) for s in SITES]]
    for got, expected in pairs:
        assert set(got) == set(expected) and got
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key])
            assert np.asarray(got[key]).dtype == np.asarray(expected[key]).dtype
    assert set(restored.fedsm.personalized) == set(SITES)
    assert restored.gamma == original.gamma
    assert restored.missed == original.missed
    assert restored.last_counts == original.last_counts
    assert restored.latest_lists == original.latest_lists


def test_state_dict_round_trip_into_a_freshfedsm_strategy():
    # Prepare
    original = _trainedfedsm_strategy()
    fresh = fedsm_strategy()

    # Execute
    fresh.load_state_dict(original.state_dict())

    # Assert
    _assert_same_state(fresh, original)
    np.testing.assert_array_equal(fresh.fedsm.personalized["site-a"]["w"], [4.0, 5.0])
    assert fresh.gamma == 0.3
    assert fresh.missed == [(1, "site-c", "no reply")]
    assert fresh.last_counts == {"site-a": 2.0, "site-b": 3.0, "site-c": 4.0}


def test_state_survives_a_checkpoint_file_and_the_resumed_run_continues_identically(tmp_path):
    # Prepare
    original = _trainedfedsm_strategy()
    path = save_checkpoint(tmp_path / "checkpoint.pt", 1, {"seed": 0}, SITES, original.name, original.state_dict(),
                           [(1, "val", "site-a", "dice", 0.5)])
    fresh = fedsm_strategy()

    # Execute
    fresh.load_state_dict(load_checkpoint(path)["state"])

    # Assert
    _assert_same_state(fresh, original)
    assert fresh.latest_lists["val"]["site-b"]["dice-super-sweep"] == [0.25, 0.75]
    round_two = [_train_reply("site-c", w(2.0, 2.0), w(4.0, 4.0), 6.0, 5.0, 40),
                 _train_reply("site-a", w(0.0, 2.0), w(0.0, 0.0), 1.0, 1.0, 10)]
    original.aggregate_train(2, round_two)
    fresh.aggregate_train(2, round_two)
    _assert_same_state(fresh, original)
    # c: 0.5 * [4, 4] + 0.25 * ([0, 0] + [5, 3]) = [3.25, 2.75]  (b kept [5, 3] from round 1)
    np.testing.assert_array_equal(fresh.fedsm.personalized["site-c"]["w"], [3.25, 2.75])
    np.testing.assert_array_equal(fresh.fedsm.personalized["site-b"]["w"], [5.0, 3.0])


def test_evaluation_messages_carry_every_personalized_model_in_node_order():
    # Prepare
    strategy = fedsm_strategy(gamma=0.4)

    # Execute
    messages = strategy.evaluation_messages("test")

    # Assert
    assert sorted(m.metadata.dst_node_id for m in messages) == [101, 102, 103]
    content = messages[0].content
    models = records.models_from_record(content[records.PERSONALIZED], 3)
    for model, expected in zip(models, ([1.0, 1.0], [2.0, 2.0], [0.0, 4.0]), strict=True):
        np.testing.assert_array_equal(model["w"], expected)
    assert content[records.CONFIG]["gamma"] == 0.4 and content[records.CONFIG]["split"] == "test"
    assert list(content[records.CONFIG]["gamma-sweep"]) == []


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_selector_moments_are_not_averaged_into_every_site(bad):
    # Prepare
    strategy = fedsm_strategy()
    replies = [*_replies_of_a_and_b(), _train_reply("site-c", w(2.0, 2.0), w(4.0, 4.0), 6.0, bad, 40)]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert: the moments every site starts the next round from stay finite: (1 + 3) / 2
    np.testing.assert_array_equal(strategy.fedsm.selector_optimizer["s/exp_avg"], [2.0])
    np.testing.assert_array_equal(strategy.fedsm.personalized["site-c"]["w"], [0.0, 4.0])
    assert [(r, s) for r, s, _ in strategy.missed] == [(1, "site-c")]
    assert "non-finite" in strategy.missed[0][2] and records.SELECTOR_OPTIMIZER in strategy.missed[0][2]


def _without(message, key: str):
    content = dict(message.content)
    del content[key]
    return reply(message.metadata.src_node_id, content)


@pytest.mark.parametrize("problem", ["no moments", "no num-examples", "zero examples"])
def test_a_malformed_reply_is_rejected_instead_of_stopping_the_run(problem):
    # Prepare
    strategy = fedsm_strategy()
    site_c = _train_reply("site-c", w(2.0, 2.0), w(4.0, 4.0), 6.0, 5.0, 0 if problem == "zero examples" else 40)
    if problem == "no moments":
        site_c = _without(site_c, records.SELECTOR_OPTIMIZER)
    elif problem == "no num-examples":
        content = dict(site_c.content)
        content[records.METRICS] = records.to_metrics({"loss": 1.0})
        site_c = reply(NODE["site-c"], content)

    # Execute
    strategy.aggregate_train(1, [*_replies_of_a_and_b(), site_c])

    # Assert: as if site-c had not replied
    np.testing.assert_array_equal(strategy.fedsm.global_weights["w"], [4.0, 7.0])
    np.testing.assert_array_equal(strategy.fedsm.personalized["site-c"]["w"], [0.0, 4.0])
    np.testing.assert_array_equal(strategy.fedsm.selector_optimizer["s/exp_avg"], [2.0])
    assert [(r, s) for r, s, _ in strategy.missed] == [(1, "site-c")]
    reason = strategy.missed[0][2]
    assert "malformed" in reason
    assert {"no moments": records.SELECTOR_OPTIMIZER, "no num-examples": "num-examples",
            "zero examples": "num-examples = 0"}[problem] in reason


def _extra_selector_reply(site: str, selector: float, moment: float):
    return reply(NODE[site], {
        records.SELECTOR: records.to_record({"e": np.array([selector])}),
        records.SELECTOR_OPTIMIZER: records.to_record({"e/exp_avg": np.array([moment])}),
        records.METRICS: train_metrics(10),
    })


def test_fedsm_extra_rejects_non_finite_selector_moments():
    # Prepare
    fedsm = FedSM(SITES, w(0.0, 0.0), {"s": np.array([0.0])}, LAM)
    strategy = FedSMExtraStrategy(fedsm, {"e": np.array([0.0])}, 2, NODES, RoundPlan(4, 1), EvaluationLog())
    replies = [_extra_selector_reply("site-a", 2.0, 1.0), _extra_selector_reply("site-b", 4.0, 3.0),
               _extra_selector_reply("site-c", 9.0, np.nan)]

    # Execute: round 3 > model_rounds = 2 trains the K + 1-output selector
    strategy.aggregate_train(3, replies)

    # Assert: equal average of a and b only
    np.testing.assert_array_equal(strategy.extra_selector["e"], [3.0])
    np.testing.assert_array_equal(strategy.extra_optimizer["e/exp_avg"], [2.0])
    assert [(r, s) for r, s, _ in strategy.missed] == [(3, "site-c")]
    assert "non-finite" in strategy.missed[0][2]
