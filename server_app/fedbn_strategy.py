"""FedBN (Li et al., ICLR 2021) as a strategy: normalization layers stay at their site."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from client_app import records
from fedsm_core.algorithms.aggregation import Weights, weighted_average
from fedsm_core.algorithms.fedbn import fedbn_aggregate, merge_local
from server_app.discovery import SiteNode
from server_app.fedavg_strategy import FedAvgStrategy
from server_app.site_strategy import EvaluationSink


class FedBNStrategy(FedAvgStrategy):
    """FedAvg on every entry but the normalization layers', which each site keeps.

    Site ``k`` trains and is evaluated with ``shared + own normalization``
    (:func:`fedsm_core.algorithms.fedbn.merge_local`); its normalization
    entries come back in its reply and stay on the server only to be sent
    back to that site (a real deployment may keep them on the node: they
    are never averaged or sent elsewhere). A site that misses a round keeps
    its normalization entries and gets the new shared ones.

    Parameters
    ----------
    global_weights : dict
        Initial weights; every site starts from them.
    local : set of str
        The normalization entries (:func:`fedsm_core.algorithms.fedbn.local_entries`).
    """

    name = "FedBN"

    def __init__(self, global_weights: Weights, local: set[str], nodes: Sequence[SiteNode], eval_every: int,
                 num_rounds: int, on_evaluate: EvaluationSink) -> None:
        super().__init__(global_weights, nodes, eval_every, num_rounds, on_evaluate, name="FedBN")
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

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Each site gets its own model."""
        return self.messages(self._own_models({"server-round": server_round}), MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the shared entries of the valid replies; keep each site's normalization entries."""
        accepted = self.accept_replies(server_round, replies)
        trained = {site: weights for site, _, weights, _ in accepted}
        sizes = {site: size for site, _, _, size in accepted}
        self.site_models.update(fedbn_aggregate(trained, sizes, self.local))
        # The averaged normalization entries are kept only as a neutral start for sites without their own.
        self.global_weights = weighted_average(list(trained.values()), list(sizes.values()))
        fixed = self.fix_amplitude(server_round, list(trained.values()), list(sizes.values()),
                                   {"": self.global_weights, **self.site_models})
        self.global_weights = fixed.pop("")
        self.site_models = fixed
        log(INFO, "round %d: %d/%d sites trained", server_round, len(trained), len(self.nodes))
        return records.to_record(self.global_weights), self.mean_metrics([reply for _, reply, _, _ in accepted])

    def evaluation_messages(self, split: str) -> list[Message]:
        """Each site evaluates its own model."""
        return self.messages(self._own_models({"split": split}), MessageType.EVALUATE)

    def _own_models(self, settings: dict[str, object]) -> dict[str, RecordDict]:
        """Site name -> a message content with that site's model and ``settings``."""
        config = records.to_config(settings)
        return {node.site_name: RecordDict({records.GLOBAL: records.to_record(self.model_of(node.site_name)),
                                          records.CONFIG: config})
                for node in self.nodes}

    def state_dict(self) -> dict[str, object]:
        """FedAvg's state plus every site's model."""
        return {**super().state_dict(), "site-models": self.site_models}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s output."""
        super().load_state_dict(state)
        self.site_models = dict(state["site-models"])
