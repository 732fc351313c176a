"""FedBN (Li et al., ICLR 2021) as a strategy: normalization layers stay at their site."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO

from flwr.app import ArrayRecord, Message, MessageType, MetricRecord
from flwr.common import log

from app_protocol.evaluate_messages import encode_model_evaluation
from app_protocol.train_messages import encode_model_train
from fedsm_core.algorithms.baselines.fedbn import fedbn_aggregate, merge_local
from fedsm_core.algorithms.robust_aggregation import robust_average
from fedsm_core.models.weights import Weights
from server_app.discovery import SiteNode
from server_app.round_plan import RoundPlan
from server_app.strategies.fedavg import FedAvgStrategy
from server_app.strategies.site_strategy import EvaluationSink


class FedBNStrategy(FedAvgStrategy):
    """FedAvg on every entry but the normalization layers', which each site keeps.

    Site ``k`` trains and is evaluated with ``shared + own normalization``
    (:func:`fedsm_core.algorithms.baselines.fedbn.merge_local`); its normalization
    entries come back in its reply and stay on the server only to be sent
    back to that site (a real deployment may keep them on the node: they
    are never averaged or sent elsewhere). A site that misses a round keeps
    its normalization entries and gets the new shared ones.

    Parameters
    ----------
    global_weights : dict
        Initial weights; every site starts from them.
    local : set of str
        The normalization entries (:func:`fedsm_core.algorithms.baselines.fedbn.local_entries`).
    """

    name = "FedBN"

    def __init__(self, global_weights: Weights, local: set[str], nodes: Sequence[SiteNode], plan: RoundPlan,
                 on_evaluate: EvaluationSink) -> None:
        super().__init__(global_weights, nodes, plan, on_evaluate, name="FedBN")
        if not local:
            raise ValueError("FedBN: the model has no normalization layers to keep local")
        self.local = set(local)
        self.site_models: dict[str, Weights] = {node.site_name: dict(global_weights) for node in nodes}

    def summary(self) -> None:
        """Log the configuration."""
        super().summary()
        log(INFO, "FedBN: %d normalization entries stay at each site", len(self.local))

    def model_of(self, site: str) -> Weights:
        """Site ``site``'s model: the current shared entries with its own normalization entries."""
        return merge_local(self.global_weights, self.site_models[site], self.local)

    def configure_train(self, server_round: int) -> Iterable[Message]:
        """Each site gets its own model."""
        contents = {node.site_name: encode_model_train(self.model_of(node.site_name), server_round)
                    for node in self.nodes}
        return self.messages(contents, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the shared entries of the valid replies; keep each site's normalization entries."""
        accepted = self.accept_replies(server_round, replies)
        trained = {site: weights for site, _, weights, _ in accepted}
        sizes = {site: size for site, _, _, size in accepted}
        self.site_models.update(fedbn_aggregate(trained, sizes, self.local, self.plan.aggregation))
        # The averaged normalization entries are kept only as a neutral start for sites without their own.
        self.global_weights = robust_average(list(trained.values()), list(sizes.values()), self.plan.aggregation)
        fixed = self.fix_amplitude(server_round, list(trained.values()), list(sizes.values()),
                                   {"": self.global_weights, **self.site_models})
        self.global_weights = fixed.pop("")
        self.site_models = fixed
        log(INFO, "round %d: %d/%d sites trained", server_round, len(trained), len(self.nodes))
        return None, self.mean_metrics([reply for _, reply, _, _ in accepted])

    def evaluation_messages(self, split: str) -> list[Message]:
        """Each site evaluates its own model."""
        contents = {node.site_name: encode_model_evaluation(self.model_of(node.site_name), split)
                    for node in self.nodes}
        return self.messages(contents, MessageType.EVALUATE)

    def state_dict(self) -> dict[str, object]:
        """FedAvg's state plus every site's model."""
        return {**super().state_dict(), "site-models": self.site_models}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s output."""
        super().load_state_dict(state)
        self.site_models = dict(state["site-models"])
