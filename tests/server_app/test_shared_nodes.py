"""Strategies with a simulated node that serves several sites: messages name their site, replies map back."""

from __future__ import annotations

import numpy as np
from flwr.app import MessageType
from support.server_fakes import PIXELS, EvaluationLog, ScriptedGrid, eval_metrics, train_metrics, w

from app_protocol import records
from server_app.discovery import SiteNode
from server_app.round_plan import RoundPlan
from server_app.strategies.fedavg import FedAvgStrategy

# node 100 serves site-a and site-c, node 101 site-b (2 simulated nodes, 3 sites)
SHARED = [SiteNode(100, 0, "site-a", 10, 8, 8, PIXELS), SiteNode(101, 1, "site-b", 30, 8, 8, PIXELS),
          SiteNode(100, 2, "site-c", 20, 8, 8, PIXELS)]
TRAINED = {"site-a": 1.0, "site-b": 2.0, "site-c": 4.0}   # each site returns w = its value
SIZES = {"site-a": 1, "site-b": 1, "site-c": 2}            # n_k / n = 1/4, 1/4, 1/2
DICE = {"site-a": 0.25, "site-b": 0.5, "site-c": 0.75}


def _answer(message):
    """Answers as the site the message names."""
    site = str(message.content[records.ROUTE]["site-name"])
    if message.metadata.message_type == MessageType.TRAIN:
        return {records.GLOBAL: records.to_record(w(TRAINED[site])), records.METRICS: train_metrics(SIZES[site])}
    return {records.METRICS: eval_metrics(DICE[site])}


def test_a_round_with_two_sites_on_one_node_keeps_them_apart():
    # Prepare
    evaluations = EvaluationLog()
    strategy = FedAvgStrategy(w(0.0), SHARED, RoundPlan(1, 1), evaluations)
    grid = ScriptedGrid(_answer)

    # Execute
    strategy.run(grid, 1, 5.0, lambda r: None)

    # Assert: every message went to its site's node; the average is 1/4 * 1 + 1/4 * 2 + 1/2 * 4 = 2.75
    routes = [(sent.node, sent.site) for sent in grid.sent]
    assert sorted(routes) == sorted([(100, "site-a"), (101, "site-b"), (100, "site-c")] * 2)
    np.testing.assert_array_equal(strategy.global_weights["w"], [2.75])
    assert strategy.missed == []
    [(_, _, per_site)] = evaluations.calls
    assert {site: m["dice"] for site, m in per_site.items()} == DICE
    assert {row["site"] for row in strategy.traffic.rows} == {"site-a", "site-b", "site-c"}


class ReversedGrid(ScriptedGrid):
    """Replies arrive in the reverse order of the messages."""

    def send_and_receive(self, messages, *, timeout=None):
        return list(reversed(super().send_and_receive(messages, timeout=timeout)))


def test_replies_are_aggregated_in_site_order_whatever_order_they_arrive_in():
    strategy = FedAvgStrategy(w(0.0), SHARED, RoundPlan(1, 1), EvaluationLog())

    replies = strategy.exchange(ReversedGrid(_answer), strategy.configure_train(1), 5.0, 1)

    assert [strategy.site_of(r) for r in replies] == ["site-a", "site-b", "site-c"]
