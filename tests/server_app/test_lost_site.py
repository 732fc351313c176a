"""A lost site is named once per round, by its site name, also when the SuperLink answers for it."""

from __future__ import annotations

from flwr.app import Error, Message, MessageType
from support.server_fakes import NODES, EvaluationLog, ScriptedGrid, eval_metrics, reply, train_metrics, w

from app_protocol import records
from server_app.round_plan import RoundPlan
from server_app.strategies.fedavg import FedAvgStrategy

SUPERLINK_NODE_ID = 1  # the node id Flower's SuperLink puts on the error replies it writes itself
NODE_UNAVAILABLE = "Error: Node Unavailable - The destination node failed to report a heartbeat"
LOST = 102  # site-b's node


def superlink_error(outgoing: Message) -> Message:
    """What the SuperLink returns for a message to a node that stopped: its own error, from itself."""
    answer = Message(Error(code=5, reason=NODE_UNAVAILABLE), reply_to=outgoing)
    answer.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
    answer.metadata.__dict__["_dst_node_id"] = SUPERLINK_NODE_ID
    return answer


def _answer(message: Message):
    """Node 102 has stopped, so the SuperLink answers for it; the others train and evaluate."""
    node = message.metadata.dst_node_id
    if node == LOST:
        return superlink_error(message)
    if message.metadata.message_type == MessageType.TRAIN:
        return {records.GLOBAL: records.to_record(w(1.0, 2.0)), records.METRICS: train_metrics(10)}
    return {records.METRICS: eval_metrics(0.5)}


def test_a_site_answered_for_by_the_superlink_is_named_once_per_round_by_its_site_name():
    # Prepare
    evaluations = EvaluationLog()
    strategy = FedAvgStrategy(w(0.0, 0.0), NODES, RoundPlan(2, 1), evaluations)

    # Execute: two rounds, each with training and validation
    strategy.run(ScriptedGrid(_answer), 1, 10.0, lambda r: None)

    # Assert: one entry per round, for site-b, saying the SuperLink answered; no "node 1" anywhere
    assert [(r, site) for r, site, _ in strategy.missed] == [(1, "site-b"), (2, "site-b")]
    assert all("unreachable" in why and "Node Unavailable" in why for _, _, why in strategy.missed)
    assert strategy.evaluation_gaps["val"] == {"site-b": f"unreachable, the SuperLink answered for it: "
                                                         f"{NODE_UNAVAILABLE}"}
    assert [sorted(per_site) for _, _, per_site in evaluations.calls] == [["site-a", "site-c"]] * 2


def test_the_test_gaps_name_sites_without_any_reply():
    strategy = FedAvgStrategy(w(0.0, 0.0), NODES, RoundPlan(1, 1), EvaluationLog())
    only_a = [reply(101, {records.METRICS: eval_metrics(0.5)}, MessageType.EVALUATE)]

    strategy.collect_evaluation(1, "test", only_a)

    assert strategy.evaluation_gaps["test"] == {"site-b": "no reply", "site-c": "no reply"}
