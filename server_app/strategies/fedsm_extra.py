"""FedSM-extra (Xu et al. 2022, Sec. 3.1.2) as a Flower strategy.

Rounds ``1..R`` train the global and personalized models as FedSM does, without
its selector; rounds ``R+1..R+E`` send every site the global and all
personalized models and train a selector with ``K + 1`` outputs toward each
image's lowest-loss model. Evaluation follows that selector's argmax.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO

from flwr.app import ArrayRecord, Message, MessageType, MetricRecord
from flwr.common import log

from app_protocol import records
from app_protocol.train_messages import encode_extra_selector_train
from fedsm_core.algorithms.fedsm.fedsm import FedSM
from fedsm_core.algorithms.robust_aggregation import robust_average
from fedsm_core.models.weights import Weights
from server_app.discovery import SiteNode
from server_app.round_plan import RoundPlan
from server_app.strategies.fedsm import FedSMStrategy
from server_app.strategies.site_strategy import EvaluationSink


class FedSMExtraStrategy(FedSMStrategy):
    """FedSM's model training, then extra rounds for an argmin-loss selector.

    Parameters
    ----------
    extra_selector : dict
        Initial weights of the ``K + 1``-output selector.
    model_rounds : int
        ``R``, the rounds that train the segmentation models.
    """

    name = "FedSM-extra"
    train_phase = "models"

    def __init__(
        self,
        fedsm: FedSM,
        extra_selector: Weights,
        model_rounds: int,
        nodes: Sequence[SiteNode],
        plan: RoundPlan,
        on_evaluate: EvaluationSink,
    ) -> None:
        super().__init__(fedsm, nodes, plan, on_evaluate, gamma=0.0)
        self.extra_selector = extra_selector
        self.extra_optimizer: Weights = {}
        self.model_rounds = model_rounds

    def configure_train(self, server_round: int) -> Iterable[Message]:
        """FedSM messages (selector frozen) up to round R, then selector messages with the super model."""
        if server_round <= self.model_rounds:
            return super().configure_train(server_round)
        content = encode_extra_selector_train(self.fedsm.global_weights, self._personalized(), self.extra_selector,
                                              self.extra_optimizer, server_round)
        return self.messages({node.site_name: content for node in self.nodes}, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedSM aggregation up to round R; afterwards the selector and its moments, per site alike."""
        if server_round <= self.model_rounds:
            return super().aggregate_train(server_round, replies)
        accepted: list[tuple[Message, dict[str, Weights]]] = []
        for reply in replies:
            decoded = self.decode_weights(server_round, self.site_of(reply), reply,
                                          {records.SELECTOR: self.extra_selector, records.SELECTOR_OPTIMIZER: None})
            if decoded is not None:
                accepted.append((reply, decoded))
        self.note_absent(server_round, [self.site_of(reply) for reply, _ in accepted])
        self.require_replies(server_round, len(accepted))
        equal = [1.0] * len(accepted)
        aggregation = self.plan.aggregation
        self.extra_selector = robust_average([decoded[records.SELECTOR] for _, decoded in accepted], equal, aggregation)
        self.extra_optimizer = robust_average([decoded[records.SELECTOR_OPTIMIZER] for _, decoded in accepted], equal,
                                              aggregation)
        log(INFO, "round %d (extra): %d/%d sites trained the selector", server_round, len(accepted), len(self.nodes))
        return None, self.mean_metrics([reply for reply, _ in accepted])

    def state_dict(self) -> dict[str, object]:
        """FedSM's state plus the K + 1-output selector and its moments."""
        return {**super().state_dict(), "extra-selector": self.extra_selector, "extra-optimizer": self.extra_optimizer}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s output."""
        super().load_state_dict(state)
        self.extra_selector = state["extra-selector"]
        self.extra_optimizer = state["extra-optimizer"]

    def _personalized(self) -> list[Weights]:
        return [self.fedsm.personalized[site] for site in self.fedsm.site_names]

    def evaluation_selector(self) -> tuple[Weights, bool]:
        """The K + 1-output selector: its argmax is followed, no gamma."""
        return self.extra_selector, True

    def finish_validation(self) -> list[str]:
        """FedSM-extra needs no gamma."""
        return []
