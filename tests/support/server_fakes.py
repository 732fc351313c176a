"""Sites, replies and records for server-strategy tests (no Flower runtime, no models).

The strategies accept any weight dictionaries, so the tests use tiny float64
arrays whose averages can be computed by hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from uuid import uuid4

import numpy as np
from flwr.app import Error, Message, MessageType, RecordDict

from app_protocol import records
from fedsm_core.data.statistics import ChannelStatistics
from server_app.discovery import SiteNode

PIXELS = ChannelStatistics(1, (0.0,), (1.0,))
NODES = [
    SiteNode(101, 0, "site-a", 10, 8, 8, PIXELS),
    SiteNode(102, 1, "site-b", 30, 8, 8, PIXELS),
    SiteNode(103, 2, "site-c", 20, 8, 8, PIXELS),
]
NODE = {node.site_name: node.node_id for node in NODES}


def w(*values: float) -> dict[str, np.ndarray]:
    """A one-array weight dictionary ``{"w": float64 array}``."""
    return {"w": np.array(values, dtype=np.float64)}


def reply(node_id: int, content: Mapping[str, object], message_type: str = MessageType.TRAIN) -> Message:
    """What node ``node_id`` answers to a message of ``message_type`` (its ``src_node_id`` is the node)."""
    outgoing = Message(RecordDict(), message_type=message_type, dst_node_id=node_id)
    return Message(RecordDict(dict(content)), reply_to=outgoing)


def error_reply(node_id: int, reason: str, message_type: str = MessageType.TRAIN) -> Message:
    """A reply that carries a client error instead of content."""
    outgoing = Message(RecordDict(), message_type=message_type, dst_node_id=node_id)
    return Message(Error(code=0, reason=reason), reply_to=outgoing)


@dataclasses.dataclass(frozen=True)
class Sent:
    """One message a :class:`ScriptedGrid` was given: its kind, destination node and routed site (if any)."""

    kind: str
    node: int
    site: str | None


class ScriptedGrid:
    """A Grid whose nodes answer by a script, for server tests without a Flower runtime.

    ``answer(message)`` returns the reply's content (a mapping of records), a
    whole reply (a :class:`Message`, e.g. :func:`error_reply`), or ``None``
    for a node that never answers. Each message gets an id and each reply
    the id it replies to, as Flower's grids give them. ``sent`` keeps every
    message; ``calls`` every ``send_and_receive`` call as ``(kind, sorted
    nodes, timeout)``; ``on_call(kind)`` runs at each call (to log its order
    among other events).
    """

    def __init__(self, answer: Callable[[Message], Mapping[str, object] | Message | None],
                 node_ids: Iterable[int] = (), on_call: Callable[[str], None] | None = None) -> None:
        self.answer, self.node_ids, self.on_call = answer, list(node_ids), on_call
        self.sent: list[Sent] = []
        self.calls: list[tuple[str, list[int], float | None]] = []

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        messages = list(messages)
        kinds = {message.metadata.message_type for message in messages}
        assert len(kinds) <= 1, f"one kind of message per call, got {kinds}"
        kind = kinds.pop() if kinds else ""
        self.calls.append((kind, sorted(m.metadata.dst_node_id for m in messages), timeout))
        if self.on_call is not None:
            self.on_call(kind)
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid4())
            node = message.metadata.dst_node_id
            site = str(message.content[records.ROUTE]["site-name"]) if records.ROUTE in message.content else None
            self.sent.append(Sent(kind, node, site))
            answer = self.answer(message)
            if answer is None:
                continue
            if not isinstance(answer, Message):
                answer = reply(node, answer, kind)
            answer.metadata.__dict__["_reply_to_message_id"] = message.metadata.message_id
            replies.append(answer)
        return replies


def train_metrics(num_examples: int, loss: float = 1.0):
    """The METRICS record of a training reply."""
    return records.to_metrics({"loss": loss, "num-examples": num_examples})


def eval_metrics(dice: float, num_images: int = 2):
    """The METRICS record of an evaluation reply."""
    return records.to_metrics({"dice": dice, "num-images": num_images})


class EvaluationLog:
    """An ``on_evaluate`` sink that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, dict[str, dict[str, float]]]] = []

    def __call__(self, server_round: int, split: str, per_site: dict[str, dict[str, float]]) -> None:
        self.calls.append((server_round, split, per_site))


SITES = [node.site_name for node in NODES]
LAM = 0.5  # SoftPull: own model * 0.5, each of the two others * 0.25


def fedsm_strategy(gamma: float = 0.5, min_replies: int = 1):
    """A FedSM strategy over the three sites: global (0, 0), personalized models a, b, c distinct.

    It averages with the mean (the paper's), which the hand-computed values of
    these tests assume; the robust aggregations have tests of their own.
    """
    from fedsm_core.algorithms.fedsm.fedsm import FedSM
    from fedsm_core.algorithms.robust_aggregation import AggregationSettings
    from server_app.round_plan import RoundPlan
    from server_app.strategies.fedsm import FedSMStrategy

    mean = AggregationSettings("mean")
    fedsm = FedSM(SITES, w(0.0, 0.0), {"s": np.array([0.0])}, LAM, aggregation=mean)
    fedsm.personalized = {"site-a": w(1.0, 1.0), "site-b": w(2.0, 2.0), "site-c": w(0.0, 4.0)}
    return FedSMStrategy(fedsm, NODES, RoundPlan(5, 1, min_replies, aggregation=mean), EvaluationLog(), gamma=gamma)


def fedavg_strategy(initial: dict[str, np.ndarray] | None = None, min_replies: int = 1):
    """A FedAvg strategy over the three sites, from ``initial`` (default: the zero model ``w(0, 0)``), the mean's."""
    from fedsm_core.algorithms.robust_aggregation import AggregationSettings
    from server_app.round_plan import RoundPlan
    from server_app.strategies.fedavg import FedAvgStrategy

    plan = RoundPlan(5, 1, min_replies, aggregation=AggregationSettings("mean"))
    return FedAvgStrategy(initial if initial is not None else w(0.0, 0.0), NODES, plan, EvaluationLog())


def model_reply(site: str, weights: dict[str, np.ndarray], num_examples: int, **extra):
    """A single-model training reply of ``site``: its weights, metrics with ``num_examples``, extra records."""
    return reply(NODE[site], {records.GLOBAL: records.to_record(weights), records.METRICS: train_metrics(num_examples),
                              **{key: records.to_record(value) for key, value in extra.items()}})
