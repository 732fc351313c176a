"""FedAvg, FedProx and SCAFFOLD over the same site strategy.

FedProx differs from FedAvg only on the client (the proximal term, with ``mu``
from the run config); SCAFFOLD adds the server control variate to each message
and updates it from the clients' control-variate deltas.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO

from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log

from app_protocol import records
from app_protocol.evaluate_messages import encode_model_evaluation
from app_protocol.train_messages import decode_weights, encode_model_train
from fedsm_core.algorithms.baselines.scaffold import update_server_control
from fedsm_core.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerSettings
from fedsm_core.models.weights import Weights
from server_app.discovery import SiteNode
from server_app.round_plan import RoundPlan
from server_app.strategies.site_strategy import EvaluationSink, SiteStrategy


class FedAvgStrategy(SiteStrategy):
    """FedAvg (McMahan et al. 2017): ``w <- sum_k (n_k / n) w_k`` over the replies.

    With a server optimizer other than ``none`` the average is a pseudo-gradient
    step instead (FedAvgM, FedAdam, FedYogi: :mod:`fedsm_core.algorithms.server_optimizer`).

    Parameters
    ----------
    global_weights : dict
        Initial model weights.
    name : str
        Shown in logs: ``FedAvg`` or ``FedProx``.
    server_optimizer : ServerOptimizerSettings, optional
        The ``server-*`` settings; plain averaging when omitted.
    optimizer_state : dict, optional
        ``optimizer-state = averaged``: the sites' Adam state to start from
        (a fresh Adam's layout, step 0); every round it becomes the average of
        the states the sites reply with, weighted as the model is. ``None``
        sends none.
    """

    def __init__(
        self,
        global_weights: Weights,
        nodes: Sequence[SiteNode],
        plan: RoundPlan,
        on_evaluate: EvaluationSink,
        name: str = "FedAvg",
        server_optimizer: ServerOptimizerSettings | None = None,
        optimizer_state: Weights | None = None,
    ) -> None:
        super().__init__(nodes, plan, on_evaluate)
        self.global_weights = global_weights
        self.name = name
        self.server_optimizer = ServerOptimizer(server_optimizer or ServerOptimizerSettings(), plan.aggregation)
        self.optimizer_state = optimizer_state

    def train_content(self, server_round: int) -> RecordDict:
        """What every site receives for a round."""
        return encode_model_train(self.global_weights, server_round, optimizer_state=self.optimizer_state)

    def configure_train(self, server_round: int) -> Iterable[Message]:
        """The same global model to every site."""
        content = self.train_content(server_round)
        return self.messages({node.site_name: content for node in self.nodes}, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Weighted average of the valid replies."""
        accepted = self.accept_replies(server_round, replies)
        trained = [weights for _, _, weights, _ in accepted]
        sizes = [size for _, _, _, size in accepted]
        steps = [self.local_steps(reply) for _, reply, _, _ in accepted]
        sites = [site for site, _, _, _ in accepted]
        self.global_weights = self.server_optimizer.aggregate(self.global_weights, trained, sizes, steps, server_round,
                                                              sites)
        self.note_left_out(server_round, sites, self.server_optimizer, "global model")
        self.global_weights = self.fix_amplitude(server_round, trained, sizes,
                                                 {"global": self.global_weights})["global"]
        if self.optimizer_state is not None:
            states = [decode_weights(reply.content, [records.OPTIMIZER_STATE])[records.OPTIMIZER_STATE]
                      for _, reply, _, _ in accepted]
            self.optimizer_state = self.server_optimizer.average(states, sizes)
        self.after_aggregation([reply for _, reply, _, _ in accepted])
        log(INFO, "round %d: %d/%d sites trained", server_round, len(accepted), len(self.nodes))
        return None, self.mean_metrics([reply for _, reply, _, _ in accepted])

    def accept_replies(self, server_round: int,
                       replies: Iterable[Message]) -> list[tuple[str, Message, Weights, int]]:
        """``(site, reply, trained weights, num-examples)`` of each valid reply.

        Invalid replies are rejected and logged, silent sites recorded, and the
        run stops when fewer than ``min-replies`` remain.
        """
        accepted: list[tuple[str, Message, Weights, int]] = []
        for reply in replies:
            site = self.site_of(reply)
            decoded = self.decode_weights(server_round, site, reply, self.expected_records())
            size = self.num_examples(server_round, site, reply) if decoded is not None else None
            if size is not None and not self.has_steps(server_round, site, reply, self.server_optimizer.settings):
                size = None
            if decoded is not None and size is not None:
                accepted.append((site, reply, decoded[records.GLOBAL], size))
        self.note_absent(server_round, [site for site, _, _, _ in accepted])
        self.require_replies(server_round, len(accepted))
        return accepted

    def expected_records(self) -> dict[str, Weights]:
        """Array records a reply must hold, with the layout they must have."""
        expected = {records.GLOBAL: self.global_weights}
        if self.optimizer_state is not None:
            expected[records.OPTIMIZER_STATE] = self.optimizer_state
        return expected

    def state_dict(self) -> dict[str, object]:
        """The base state plus the global model."""
        return {**super().state_dict(), "global": self.global_weights,
                "server-optimizer": self.server_optimizer.state_dict(), "optimizer-state": self.optimizer_state}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s output."""
        super().load_state_dict(state)
        self.global_weights = state["global"]
        self.server_optimizer.load_state_dict(state.get("server-optimizer", {}))  # none in older checkpoints
        if self.optimizer_state is not None:
            self.optimizer_state = state.get("optimizer-state") or self.optimizer_state

    def after_aggregation(self, replies: Sequence[Message]) -> None:
        """Hook for strategies that keep more server state than the model."""

    def evaluation_content(self, split: str) -> RecordDict:
        """The global model."""
        return encode_model_evaluation(self.global_weights, split)


class ScaffoldStrategy(FedAvgStrategy):
    """SCAFFOLD (Karimireddy et al. 2020): FedAvg plus a server control variate ``c``.

    Each message also carries ``c``; each reply carries ``c_k+ - c_k`` and
    ``c <- c + (1 / N) sum_k (c_k+ - c_k)``.
    """

    def __init__(self, server_control: Weights, *args, **kwargs) -> None:
        super().__init__(*args, name="SCAFFOLD", **kwargs)
        self.server_control = server_control

    def train_content(self, server_round: int) -> RecordDict:
        """The global model and the server control variate."""
        return encode_model_train(self.global_weights, server_round, self.server_control, self.optimizer_state)

    def expected_records(self) -> dict[str, Weights]:
        """The model and the control-variate delta."""
        return {**super().expected_records(), records.CONTROL_DELTA: self.server_control}

    def state_dict(self) -> dict[str, object]:
        """FedAvg's state plus the server control variate ``c``.

        The sites' own ``c_k`` live on the nodes and restart from zero in a
        resumed run (a new run), as they would for a site that joins late.
        """
        return {**super().state_dict(), "server-control": self.server_control}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s output."""
        super().load_state_dict(state)
        self.server_control = state["server-control"]

    def after_aggregation(self, replies: Sequence[Message]) -> None:
        """Move ``c`` by the mean control-variate delta over all N sites."""
        deltas = [decode_weights(reply.content, [records.CONTROL_DELTA])[records.CONTROL_DELTA] for reply in replies]
        self.server_control = update_server_control(self.server_control, deltas, len(self.nodes),
                                                    self.plan.aggregation)
