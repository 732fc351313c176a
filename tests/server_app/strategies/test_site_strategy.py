"""SiteStrategy.run: the app's own round loop (resumable), driven by a fake Grid."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import MessageType
from support.server_fakes import NODES, EvaluationLog, ScriptedGrid, eval_metrics, train_metrics, w

from app_protocol import records
from server_app.round_plan import RoundPlan
from server_app.strategies.fedavg import FedAvgStrategy

SIZES = {101: 1, 102: 1, 103: 2}  # n_k / n = 1/4, 1/4, 1/2: exact in binary


def _answer(message):
    """Every node answers: training with its round number as weights, evaluation with Dice 0.5."""
    node = message.metadata.dst_node_id
    if message.metadata.message_type == MessageType.TRAIN:
        server_round = int(message.content[records.CONFIG]["server-round"])
        return {records.GLOBAL: records.to_record(w(float(server_round), float(node))),
                records.METRICS: train_metrics(SIZES[node])}
    return {records.METRICS: eval_metrics(0.5)}


def _grid(events: list[tuple]) -> ScriptedGrid:
    """The scripted grid, logging each send among the strategy's events."""
    return ScriptedGrid(_answer, on_call=lambda kind: events.append(("send", kind)))


class SpyStrategy(FedAvgStrategy):
    """FedAvg that logs every strategy method ``run`` calls."""

    def __init__(self, events: list[tuple], eval_every: int, num_rounds: int, min_replies: int = 1) -> None:
        self.evaluations = EvaluationLog()
        super().__init__(w(0.0, 0.0), NODES, RoundPlan(num_rounds, eval_every, min_replies), self.evaluations)
        self.events = events

    def configure_train(self, server_round):
        self.events.append(("configure_train", server_round))
        return super().configure_train(server_round)

    def aggregate_train(self, server_round, replies):
        self.events.append(("aggregate_train", server_round))
        return super().aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round):
        self.events.append(("configure_evaluate", server_round))
        return super().configure_evaluate(server_round)

    def aggregate_evaluate(self, server_round, replies):
        self.events.append(("aggregate_evaluate", server_round))
        return super().aggregate_evaluate(server_round, replies)


def _run(first_round: int, num_rounds: int, eval_every: int, timeout: float = 12.5):
    events: list[tuple] = []
    grid = _grid(events)
    strategy = SpyStrategy(events, eval_every, num_rounds)
    strategy.run(grid, first_round, timeout, lambda r: events.append(("after_round", r)))
    return strategy, grid, events


def _rounds_of(events, name):
    return [event[1] for event in events if event[0] == name]


def test_a_resumed_run_executes_only_the_remaining_rounds_in_order():
    # Execute
    strategy, grid, events = _run(first_round=3, num_rounds=4, eval_every=1)

    # Assert
    assert _rounds_of(events, "configure_train") == [3, 4]
    assert _rounds_of(events, "aggregate_train") == [3, 4]
    assert _rounds_of(events, "after_round") == [3, 4]
    assert [c[0] for c in strategy.evaluations.calls] == [3, 4]


def test_each_round_trains_aggregates_evaluates_then_calls_after_round():
    # Execute
    _, _, events = _run(first_round=1, num_rounds=2, eval_every=1)

    # Assert
    one_round = ["configure_train", "send", "aggregate_train", "configure_evaluate", "send", "aggregate_evaluate",
                 "after_round"]
    assert [event[0] for event in events] == one_round * 2
    assert [event[1] for event in events if event[0] != "send"] == [1] * 5 + [2] * 5
    assert [event[1] for event in events if event[0] == "send"] == [MessageType.TRAIN, MessageType.EVALUATE] * 2


def test_evaluation_every_eval_every_rounds_and_in_the_last_one():
    # Execute
    strategy, grid, events = _run(first_round=2, num_rounds=7, eval_every=3)

    # Assert: rounds 2..7; 3 and 6 are multiples of 3, 7 is the last
    assert _rounds_of(events, "configure_train") == [2, 3, 4, 5, 6, 7]
    assert _rounds_of(events, "configure_evaluate") == [2, 3, 4, 5, 6, 7]
    assert _rounds_of(events, "aggregate_evaluate") == [3, 6, 7]
    assert [(r, split) for r, split, _ in strategy.evaluations.calls] == [(3, "val"), (6, "val"), (7, "val")]
    kinds = [kind for kind, _, _ in grid.calls]
    assert kinds.count(MessageType.TRAIN) == 6 and kinds.count(MessageType.EVALUATE) == 3


def test_messages_go_to_every_node_with_the_round_timeout():
    # Execute
    _, grid, _ = _run(first_round=1, num_rounds=1, eval_every=5, timeout=12.5)

    # Assert: the last round is evaluated even though 1 % 5 != 0
    assert grid.calls == [(MessageType.TRAIN, [101, 102, 103], 12.5), (MessageType.EVALUATE, [101, 102, 103], 12.5)]


def test_after_round_sees_the_model_of_that_round():
    # Prepare
    events: list[tuple] = []
    strategy = SpyStrategy(events, 1, 3)
    seen: list[np.ndarray] = []

    # Execute
    strategy.run(_grid(events), 2, 1.0, lambda r: seen.append(strategy.global_weights["w"].copy()))

    # Assert: every node sends [round, node id]; w = [round, 101 / 4 + 102 / 4 + 103 / 2]
    assert len(seen) == 2
    np.testing.assert_array_equal(seen[0], [2.0, 102.25])
    np.testing.assert_array_equal(seen[1], [3.0, 102.25])


def test_a_first_round_after_the_last_runs_nothing():
    # Execute
    _, grid, events = _run(first_round=5, num_rounds=4, eval_every=1)

    # Assert
    assert events == [] and grid.calls == []


def test_a_failing_round_stops_the_run_before_after_round():
    # Prepare
    events: list[tuple] = []
    strategy = SpyStrategy(events, 1, 3, min_replies=4)  # three sites can never satisfy it

    # Execute / Assert
    with pytest.raises(RuntimeError, match="min-replies"):
        strategy.run(_grid(events), 1, 1.0, lambda r: events.append(("after_round", r)))
    assert _rounds_of(events, "after_round") == []
    assert _rounds_of(events, "configure_train") == [1]


def test_run_records_one_traffic_row_per_site_direction_and_type_per_round():
    # Execute: rounds 1..2, validation in both
    strategy, _, _ = _run(first_round=1, num_rounds=2, eval_every=1)

    # Assert
    keys = [(r["round"], r["stage"], r["site"], r["direction"]) for r in strategy.traffic.rows]
    expected = {(rnd, stage, node.site_name, direction) for rnd in (1, 2) for stage in ("train", "evaluate")
                for node in NODES for direction in ("sent", "received")}
    assert len(keys) == len(set(keys)) == len(expected) == 24
    assert set(keys) == expected


def test_traffic_bytes_of_the_fake_round_by_hand():
    # Execute
    strategy, _, _ = _run(first_round=1, num_rounds=1, eval_every=1)

    # Assert: w is two float64 = 128-byte .npy header + 16; config "server-round" 8 bytes, "split" "val" 3;
    # every sent message names its site ("site-a": 6 bytes); training replies add loss + num-examples (16),
    # evaluation replies dice + num-images (16)
    sizes = {(r["stage"], r["direction"]): (r["bytes"], r["array-bytes"]) for r in strategy.traffic.rows}
    assert sizes == {("train", "sent"): (158, 144), ("train", "received"): (160, 144),
                     ("evaluate", "sent"): (153, 144), ("evaluate", "received"): (16, 0)}


def test_run_times_each_round_and_each_exchange():
    # Execute: rounds 2..4, validation only in 3 and 4
    strategy, _, _ = _run(first_round=2, num_rounds=4, eval_every=3)

    # Assert
    parts = [(t["round"], t["part"]) for t in strategy.traffic.timings]
    assert parts == [(2, "train"), (2, "round"), (3, "train"), (3, "evaluate"), (3, "round"),
                     (4, "train"), (4, "evaluate"), (4, "round")]
    assert all(t["seconds"] >= 0 for t in strategy.traffic.timings)


def test_exchange_labels_rows_with_the_given_stage():
    # Prepare
    events: list[tuple] = []
    strategy = SpyStrategy(events, 1, 3)

    # Execute
    replies = strategy.exchange(_grid(events), strategy.evaluation_messages("test"), 1.0, 3, stage="test")

    # Assert
    assert len(replies) == 3
    assert {(r["round"], r["stage"]) for r in strategy.traffic.rows} == {(3, "test")}
    assert [t["part"] for t in strategy.traffic.timings] == ["test"]


def test_every_message_names_the_runs_state_key_and_a_resumed_run_keeps_the_original():
    # Prepare
    strategy = FedAvgStrategy(w(0.0, 0.0), NODES, RoundPlan(3, 1, state_key="first-run"), EvaluationLog())
    saved = strategy.state_dict()
    resumed = FedAvgStrategy(w(0.0, 0.0), NODES, RoundPlan(3, 1, state_key="second-run"), EvaluationLog())

    # Execute
    resumed.load_state_dict(saved)

    # Assert
    for built in (strategy, resumed):
        messages = list(built.configure_train(1))
        assert {records.decode_state_key(m.content) for m in messages} == {"first-run"}
    assert records.decode_state_key(strategy.evaluation_messages("val")[0].content) == "first-run"


def test_when_after_round_says_stop_training_ends_and_that_round_becomes_the_last():
    # Prepare: the stopping rule (stand-in) holds after round 4 of 10
    events: list[tuple] = []
    strategy = SpyStrategy(events, eval_every=2, num_rounds=10)

    # Execute
    strategy.run(_grid(events), 1, 12.5, lambda r: events.append(("after_round", r)) or r == 4)

    # Assert: rounds 1-4 trained, each checkpointed (after_round), and the test will name round 4
    assert _rounds_of(events, "configure_train") == [1, 2, 3, 4]
    assert _rounds_of(events, "after_round") == [1, 2, 3, 4]
    assert strategy.num_rounds == 4


def test_a_stop_on_the_last_round_changes_nothing():
    events: list[tuple] = []
    strategy = SpyStrategy(events, eval_every=2, num_rounds=3)
    strategy.run(_grid(events), 1, 12.5, lambda r: True if r == 3 else None)
    assert _rounds_of(events, "configure_train") == [1, 2, 3] and strategy.num_rounds == 3
