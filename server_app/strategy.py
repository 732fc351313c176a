"""FedSM as a Flower strategy: per-site messages, FedSM aggregation, federated evaluation."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from client_app import records
from fedsm_core.algorithms.aggregation import check_same_layout
from fedsm_core.algorithms.fedsm import FedSM, FedSMUpdate
from fedsm_core.reporting import pool_site_metrics
from server_app.discovery import SiteNode

EvaluationSink = Callable[[int, str, dict[str, dict[str, float]]], None]


class FedSMStrategy(Strategy):
    """Drives FedSM (Xu et al. 2022) over a Flower grid.

    Each node gets the global model, *its own* personalized model, the selector
    and the selector's averaged Adam moments; replies are folded in by
    :class:`fedsm_core.algorithms.fedsm.FedSM` (weighted averaging + SoftPull).
    Evaluation messages carry the whole super model, which Algorithm 2 needs.

    Parameters
    ----------
    fedsm : FedSM
        The server state.
    nodes : sequence of SiteNode
        Node of each site, from :func:`server_app.discovery.discover_sites`.
    gamma : float
        Selector confidence threshold used in evaluation.
    eval_every : int
        Evaluate on validation data every this many rounds (and in the last one).
    num_rounds : int
        Total rounds, so the last one is always evaluated.
    on_evaluate : callable
        Receives ``(round, split, per-site metrics)`` after each evaluation.
    """

    def __init__(
        self,
        fedsm: FedSM,
        nodes: Sequence[SiteNode],
        gamma: float,
        eval_every: int,
        num_rounds: int,
        on_evaluate: EvaluationSink,
    ) -> None:
        self.fedsm = fedsm
        self.nodes = list(nodes)
        self.site_of_node = {node.node_id: node.site_name for node in nodes}
        self.gamma = gamma
        self.eval_every = eval_every
        self.num_rounds = num_rounds
        self.on_evaluate = on_evaluate
        self.missed: list[tuple[int, str, str]] = []

    def summary(self) -> None:
        """Log the configuration."""
        log(INFO, "FedSM: %d sites %s, SoftPull lambda=%.3f, gamma=%.3f, evaluation every %d round(s)",
            len(self.nodes), [n.site_name for n in self.nodes], self.fedsm.lam, self.gamma, self.eval_every)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One message per site with the global, its personalized model and the selector."""
        shared = {
            records.GLOBAL: records.to_record(self.fedsm.global_weights),
            records.SELECTOR: records.to_record(self.fedsm.selector_weights),
            records.SELECTOR_OPTIMIZER: records.to_record(self.fedsm.selector_optimizer),
            records.CONFIG: records.to_config({"server-round": server_round}),
        }
        messages = []
        for node in self.nodes:
            personal = records.to_record(self.fedsm.payload_for(node.site_name).personal_weights)
            content = RecordDict({**shared, records.PERSONAL: personal})
            messages.append(Message(content, message_type=MessageType.TRAIN, dst_node_id=node.node_id))
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedSM aggregation of the valid replies; invalid or missing sites are logged."""
        updates: dict[str, FedSMUpdate] = {}
        losses: dict[str, list[float]] = {}
        for reply in replies:
            site = self.site_of_node.get(reply.metadata.src_node_id, f"node {reply.metadata.src_node_id}")
            update = self._decode_update(server_round, site, reply)
            if update is None:
                continue
            updates[site] = update
            for key, value in reply.content[records.METRICS].items():
                losses.setdefault(key, []).append(float(value))
        for node in self.nodes:
            if node.site_name not in updates and not any(m[:2] == (server_round, node.site_name) for m in self.missed):
                self.missed.append((server_round, node.site_name, "no reply"))
        if not updates:
            raise RuntimeError(f"round {server_round}: no valid reply from any site; see the log lines above")
        self.fedsm.aggregate(updates)
        means = {key: float(np.mean(values)) for key, values in losses.items()}
        log(INFO, "round %d: %d/%d sites trained; mean losses %s", server_round, len(updates), len(self.nodes),
            {k: round(v, 4) for k, v in means.items() if k.startswith("loss")})
        return records.to_record(self.fedsm.global_weights), records.to_metrics(means)

    def _decode_update(self, server_round: int, site: str, reply: Message) -> FedSMUpdate | None:
        if reply.has_error():
            return self._reject(server_round, site, f"client error: {reply.error.reason}")
        content = reply.content
        try:
            update = FedSMUpdate(
                global_weights=records.from_record(content[records.GLOBAL]),
                personal_weights=records.from_record(content[records.PERSONAL]),
                selector_weights=records.from_record(content[records.SELECTOR]),
                selector_optimizer=records.from_record(content[records.SELECTOR_OPTIMIZER]),
                num_examples=int(content[records.METRICS]["num-examples"]),
            )
            check_same_layout(self.fedsm.global_weights, update.global_weights, f"global model from {site}")
            check_same_layout(self.fedsm.global_weights, update.personal_weights, f"personalized model from {site}")
            check_same_layout(self.fedsm.selector_weights, update.selector_weights, f"selector from {site}")
        except (KeyError, ValueError) as error:
            return self._reject(server_round, site, f"malformed reply: {error}")
        for part in (update.global_weights, update.personal_weights, update.selector_weights):
            bad = [key for key, value in part.items() if not np.all(np.isfinite(value))]
            if bad:
                return self._reject(server_round, site, f"non-finite values in {bad[:3]}")
        return update

    def _reject(self, server_round: int, site: str, reason: str) -> None:
        log(WARNING, "round %d: reply of %s rejected (%s)", server_round, site, reason)
        self.missed.append((server_round, site, reason))
        return None

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Validation-split evaluation every ``eval_every`` rounds and in the last round."""
        if server_round % self.eval_every and server_round != self.num_rounds:
            return []
        return self.evaluation_messages("val")

    def evaluation_messages(self, split: str) -> list[Message]:
        """Messages carrying the whole super model, to evaluate ``split`` at every site."""
        content = RecordDict(
            {
                records.GLOBAL: records.to_record(self.fedsm.global_weights),
                records.PERSONALIZED: records.models_to_record(
                    [self.fedsm.personalized[node.site_name] for node in self.nodes]
                ),
                records.SELECTOR: records.to_record(self.fedsm.selector_weights),
                records.CONFIG: records.to_config({"split": split, "gamma": self.gamma}),
            }
        )
        return [Message(content, message_type=MessageType.EVALUATE, dst_node_id=node.node_id) for node in self.nodes]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Collect per-site validation metrics; return the pooled ones."""
        return self.collect_evaluation(server_round, "val", replies)

    def collect_evaluation(self, server_round: int, split: str, replies: Iterable[Message]) -> MetricRecord | None:
        """Per-site metrics of an evaluation round, passed to ``on_evaluate``; pooled values returned."""
        per_site: dict[str, dict[str, float]] = {}
        for reply in replies:
            site = self.site_of_node.get(reply.metadata.src_node_id, f"node {reply.metadata.src_node_id}")
            if reply.has_error():
                log(WARNING, "round %d: %s evaluation of %s failed: %s", server_round, split, site, reply.error.reason)
                continue
            per_site[site] = {k: float(v) for k, v in reply.content[records.METRICS].items()}
        if not per_site:
            return None
        ordered = {node.site_name: per_site[node.site_name] for node in self.nodes if node.site_name in per_site}
        self.on_evaluate(server_round, split, ordered)
        return records.to_metrics(pool_site_metrics(ordered))
