"""FedSM as a Flower strategy: per-site messages, FedSM aggregation, super-model evaluation."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from app_protocol import records
from app_protocol.evaluate_messages import (
    decode_models_reply,
    encode_models_query,
    encode_super_model_evaluation,
)
from app_protocol.train_messages import FEDSM_KEYS, decode_fedsm_reply, encode_fedsm_train
from fedsm_core.algorithms.fedsm.fedsm import FedSM, FedSMUpdate
from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID, describe_gamma, pool_sweeps, select_gamma
from fedsm_core.algorithms.fedsm.super_model import Gamma, check_gamma
from fedsm_core.models.weights import Weights
from server_app.discovery import SiteNode
from server_app.round_plan import RoundPlan
from server_app.strategies.fine_tuning import SiteFineTuning, fine_tune_after_stop, fine_tune_sites, fine_tuning_notes
from server_app.strategies.selector_head_query import fit_selector_head
from server_app.strategies.site_strategy import EvaluationSink, SiteStrategy


class FedSMStrategy(SiteStrategy):
    """Drives FedSM (Xu et al. 2022) over a Flower grid.

    Each node gets the global model, *its own* personalized model, the selector
    and the selector's averaged Adam moments; replies are folded in by
    :class:`fedsm_core.algorithms.fedsm.fedsm.FedSM` (weighted averaging + SoftPull).
    A site whose reply is missing or rejected keeps its personalized model.
    Evaluation messages carry the whole super model, which Algorithm 2 needs.

    Parameters
    ----------
    fedsm : FedSM
        The server state.
    plan : RoundPlan
        Rounds, evaluation schedule, minimum replies, amplitude schedule.
    gamma : float
        Selector confidence threshold used in evaluation until validation chooses one.
    gamma_selection : {"per-model", "validation", "client-average", "fixed"}
        How each validation round chooses gamma from its sweep
        (:meth:`restate_validation`): one per personalized model, one for all
        (the best pooled validation Dice of the super model), or none
        (``gamma`` stays as given).
    selector_shrinkage : float or None
        Before every evaluation, refit the selector's linear head from the
        sites' embedding statistics with this covariance shrinkage
        (:mod:`fedsm_core.algorithms.fedsm.selector_head`); ``None`` keeps the
        head as federated training left it (``selector-head = "trained"``).
    statistics_views : int or None
        Embeddings per training image in a site's statistics
        (:func:`~fedsm_core.algorithms.fedsm.selector_head.views_per_image`): a
        site's count must be its reported training images times this, or its
        statistics are rejected; ``None`` does not check the count.
    """

    name = "FedSM"
    train_phase = ""  # FedSM-extra marks its model rounds

    def __init__(
        self,
        fedsm: FedSM,
        nodes: Sequence[SiteNode],
        plan: RoundPlan,
        on_evaluate: EvaluationSink,
        gamma: Gamma = 0.5,
        gamma_selection: str = "fixed",
        selector_shrinkage: float | None = None,
        statistics_views: int | None = None,
        fine_tune_passes: int = 0,
    ) -> None:
        super().__init__(nodes, plan, on_evaluate)
        self.fedsm = fedsm
        self.fine_tune_passes = fine_tune_passes
        self.fine_tuned: list[SiteFineTuning] | None = None  # set once the sites fine-tuned (fine-tune-passes > 0)
        self.selector_shrinkage = selector_shrinkage
        self.statistics_views = statistics_views
        self.gamma: Gamma = gamma
        self.gamma_selection = gamma_selection
        self.last_counts: dict[str, float] = {}
        self.needed: dict[str, dict[str, list[int]]] = {}  # split -> site -> models its images need
        self.closed_routes: dict[str, list[tuple[int, str]]] = {}  # site -> (round, why) no statistics were accepted
        self.closed_now: frozenset[str] = frozenset()  # sites whose routes the current selector head closes

    def summary(self) -> None:
        """Log the configuration."""
        super().summary()
        log(INFO, "FedSM: SoftPull lambda=%.3f, gamma=%s (%s), selector averaged %s",
            self.fedsm.lam, self.gamma, self.gamma_selection, self.fedsm.selector_weighting)
        log(INFO, "FedSM: personalized models trained by %s", self.fedsm.personalization)

    def configure_train(self, server_round: int) -> Iterable[Message]:
        """One message per site with the global, its personalized model and the selector."""
        contents = {node.site_name: encode_fedsm_train(self.fedsm.payload_for(node.site_name), server_round,
                                                       self.train_phase)
                    for node in self.nodes}
        return self.messages(contents, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedSM aggregation of the valid replies; invalid or missing sites are logged."""
        # The selector's moments (None) are averaged into what every site gets: any layout, but finite.
        expected = dict(zip(FEDSM_KEYS, (self.fedsm.global_weights, self.fedsm.global_weights,
                                         self.fedsm.selector_weights, None), strict=True))
        updates: dict[str, FedSMUpdate] = {}
        accepted: list[Message] = []
        for reply in replies:
            site = self.site_of(reply)
            decoded = self.decode_weights(server_round, site, reply, expected)
            if decoded is None:
                continue
            num_examples = self.num_examples(server_round, site, reply)
            if num_examples is None or not self.has_steps(server_round, site, reply,
                                                          self.fedsm.global_optimizer.settings):
                continue
            updates[site] = decode_fedsm_reply(decoded, num_examples, self.local_steps(reply))
            accepted.append(reply)
        self.note_absent(server_round, updates)
        self.require_replies(server_round, len(updates))
        self.fedsm.aggregate(updates, server_round)
        self.note_left_out(server_round, list(updates), self.fedsm.global_optimizer, "global model")
        self._fix_amplitude(server_round, list(updates.values()))
        metrics = self.mean_metrics(accepted)
        log(INFO, "round %d: %d/%d sites trained", server_round, len(updates), len(self.nodes))
        return None, metrics  # the state lives in self.fedsm; nothing is serialized for Flower to drop

    def _fix_amplitude(self, server_round: int, updates: list[FedSMUpdate]) -> None:
        """In HarmoFL's freeze round, give the global and every personalized model the global amplitude."""
        if self.plan.amplitude is None or not self.plan.amplitude.due(server_round):
            return
        log(INFO, "round %d: %d sites' average amplitudes merged into the global amplitude, fixed from now on",
            server_round, len(updates))
        self.fedsm.fix_amplitude(self.plan.amplitude, updates)

    def prepare_evaluation(self, grid: Grid, server_round: int, timeout: float, split: str) -> None:
        """Before validation, fit the selector head (``selector-head = fitted``); ask which models each site needs.

        Before the last round's validation, with ``fine-tune-passes`` set, the sites first fine-tune.
        """
        if split == "val" and self.fine_tune_passes and server_round == self.num_rounds and self.fine_tuned is None:
            self.fine_tuned = fine_tune_sites(self, self.fedsm, self.fine_tune_passes, grid, server_round, timeout)
        if split == "val" and self.selector_shrinkage is not None:
            self.closed_now = fit_selector_head(self, grid, server_round, timeout)
        self.needed[split] = self._ask_needed_models(grid, server_round, timeout, split)

    def finish_rounds(self, grid: Grid, timeout: float) -> None:
        """After a round the stopping rule ended on, fine-tune (``fine-tune-passes``) and validate it again."""
        if self.fine_tune_passes and self.fine_tuned is None:
            fine_tune_after_stop(self, grid, timeout)

    def evaluation_selector(self) -> tuple[Weights, bool]:
        """The selector the super model routes with, and whether it has a global output (FedSM-extra)."""
        return self.fedsm.selector_weights, False

    def _ask_needed_models(self, grid: Grid, server_round: int, timeout: float, split: str) -> dict[str, list[int]]:
        """Site -> the personalized models its ``split`` images can be routed to (and its own).

        Only these travel in the evaluation message
        (:mod:`fedsm_core.algorithms.fedsm.needed_models`); a site that does
        not answer gets every model, so a lost reply costs bytes, not results.
        """
        selector, includes_global = self.evaluation_selector()
        content = encode_models_query(selector, split, includes_global)
        messages = self.messages({node.site_name: content for node in self.nodes}, MessageType.QUERY)
        needed: dict[str, list[int]] = {}
        for reply in self.exchange(grid, messages, timeout, server_round, stage="needed-models"):
            site = self.site_of(reply)
            try:
                if reply.has_error():
                    raise ValueError(f"client error: {reply.error.reason}")
                needed[site] = decode_models_reply(reply.content, len(self.fedsm.site_names))
            except (KeyError, ValueError) as error:
                log(WARNING, "round %d: %s did not say which models it needs (%s); it gets all of them",
                    server_round, site, error)
        return needed

    def state_dict(self) -> dict[str, object]:
        """The base state plus the super model, the selector's moments and gamma."""
        return {**super().state_dict(), "global": self.fedsm.global_weights, "personalized": self.fedsm.personalized,
                "selector": self.fedsm.selector_weights, "selector-optimizer": self.fedsm.selector_optimizer,
                "gamma": self.gamma, "last-counts": self.last_counts,
                "server-optimizer": self.fedsm.global_optimizer.state_dict(),
                "fine-tuned": None if self.fine_tuned is None else {
                    "round": self.num_rounds, "sites": [dataclasses.astuple(e) for e in self.fine_tuned]}}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s output."""
        super().load_state_dict(state)
        self.fedsm.global_weights = state["global"]
        self.fedsm.personalized = dict(state["personalized"])
        self.fedsm.selector_weights = state["selector"]
        self.fedsm.selector_optimizer = state["selector-optimizer"]
        self.gamma = check_gamma(state["gamma"])
        self.last_counts = dict(state["last-counts"])
        self.fedsm.global_optimizer.load_state_dict(state.get("server-optimizer", {}))  # none in older checkpoints
        tuned = state.get("fine-tuned")
        if tuned is not None and tuned["round"] < self.num_rounds:
            raise ValueError(f"the checkpoint's personalized models were fine-tuned after its last round, "
                             f"{tuned['round']} (fine-tune-passes), so the run cannot continue to round "
                             f"{self.num_rounds}; start a new run with num-server-rounds = {self.num_rounds}")
        self.fine_tuned = None if tuned is None else [SiteFineTuning(*entry) for entry in tuned["sites"]]

    def evaluation_messages(self, split: str) -> list[Message]:
        """The super model for each site, with only the personalized models the site said it needs."""
        needed = self.needed.get(split, {})
        contents = {node.site_name: self.evaluation_content(split, needed.get(node.site_name))
                    for node in self.nodes}
        return self.messages(contents, MessageType.EVALUATE)

    def evaluation_content(self, split: str, send: Sequence[int] | None = None) -> RecordDict:
        """Global model, personalized models ``send`` (default: all), selector and gamma."""
        selector, includes_global = self.evaluation_selector()
        sweep = GAMMA_GRID if split == "val" and not includes_global else ()
        return encode_super_model_evaluation(
            self.fedsm.global_weights, [self.fedsm.personalized[site] for site in self.fedsm.site_names],
            selector, split, self.gamma, sweep, includes_global, send)

    def restate_validation(self, per_site: dict[str, dict[str, float]],
                           lists: dict[str, dict[str, list[float]]]) -> None:
        """Choose gamma on this validation round's sweeps (``gamma_selection``) and report the super model at it.

        Every validation round then shows the super model as it would be
        deployed after that round: ``dice-super``, ``share-global`` and
        ``gamma`` (of each site's own model) are those at the chosen gamma,
        not at the configured one. The last round's choice is the run's
        gamma, used on test and saved. A site whose route the selector head
        closed this round (its statistics missing or rejected) takes no part
        in the choice: its validation scores, its images sent to other sites'
        models, would otherwise choose gamma for everyone.
        """
        swept = {site: {**per_site[site], **values} for site, values in lists.items()
                 if "dice-super-sweep" in values and site in per_site}
        if not swept or self.gamma_selection == "fixed":
            return
        choosing = {site: values for site, values in swept.items() if site not in self.closed_now} or swept
        if len(choosing) < len(swept):
            log(INFO, "gamma chosen without the validation scores of %s (closed routes)",
                ", ".join(sorted(set(swept) - set(choosing))))
        self.gamma = select_gamma(self.gamma_selection, choosing, self.gamma)
        if isinstance(self.gamma, tuple):
            self._restate_per_model(per_site, swept)
            return
        index = GAMMA_GRID.index(self.gamma)
        for site, values in swept.items():
            per_site[site]["dice-super"] = values["dice-super-sweep"][index]
            if "share-global-sweep" in values:
                per_site[site]["share-global"] = values["share-global-sweep"][index]
            per_site[site]["gamma"] = self.gamma

    def _restate_per_model(self, per_site: dict[str, dict[str, float]], swept: dict[str, dict[str, object]]) -> None:
        """Each site's Dice and share routed to global at the chosen gamma per model, from its gain sweeps."""
        size = len(GAMMA_GRID)
        chosen = [(model, GAMMA_GRID.index(gamma)) for model, gamma in enumerate(self.gamma)]
        for site, values in swept.items():
            gains = np.reshape(values["routing-gain-sweep"], (-1, size))
            counts = np.reshape(values["routed-count-sweep"], (-1, size))
            metrics = per_site[site]
            gain = sum(gains[m, g] for m, g in chosen)
            metrics["dice-super"] = metrics["dice-global"] + gain / max(_with_foreground(metrics), 1.0)
            metrics["share-global"] = 1.0 - sum(counts[m, g] for m, g in chosen) / max(metrics["num-images"], 1.0)
            metrics["gamma"] = self.gamma[self.fedsm.site_names.index(site)]

    def finish_validation(self) -> list[str]:
        """Notes for the summary: the last validation round's Dice by gamma, the gamma chosen, closed routes."""
        sweeps = {
            site: (lists["dice-super-sweep"], self.last_counts.get(site, 0.0))
            for site, lists in self.latest_lists.get("val", {}).items()
            if "dice-super-sweep" in lists
        }
        closed = [f"selector statistics of {site} missing, rejected or set aside in round(s) "
                  f"{', '.join(str(r) for r, _ in events)} "
                  f"(last: {events[-1][1]}): no image went to its personalized model in those evaluations"
                  for site, events in self.closed_routes.items()]
        if not sweeps:
            return closed
        notes = [f"pooled validation Dice of the super model by gamma: {_by_gamma(pool_sweeps(sweeps, GAMMA_GRID))}"]
        if self.gamma_selection == "client-average":
            average = pool_sweeps({site: (dice, 1.0) for site, (dice, _) in sweeps.items()}, GAMMA_GRID)
            notes.append(f"client-average validation Dice of the super model by gamma: {_by_gamma(average)}")
        notes += closed + fine_tuning_notes(self.fine_tuned or [], self.fedsm.site_names, self.fine_tune_passes)
        if self.gamma_selection != "fixed":
            notes.append(f"gamma chosen on validation: {describe_gamma(self.gamma, self.fedsm.site_names)}")
            log(INFO, "gamma chosen on validation data: %s", describe_gamma(self.gamma, self.fedsm.site_names))
        return notes

    def collect_evaluation(self, server_round: int, split: str, replies: Iterable[Message]) -> MetricRecord | None:
        """As the base class; also remembers each site's image count for pooling the sweep."""
        replies = list(replies)
        result = super().collect_evaluation(server_round, split, replies)
        for reply in replies:
            if not reply.has_error():
                metrics = reply.content[records.METRICS]
                self.last_counts[self.site_of(reply)] = _with_foreground(
                    {key: float(metrics[key]) for key in ("num-images", "num-empty") if key in metrics})
        return result


def _with_foreground(metrics: dict[str, float]) -> float:
    """Images of a site's evaluation that enter its Dice means (those with foreground)."""
    return metrics.get("num-images", 0.0) - metrics.get("num-empty", 0.0)


def _by_gamma(values: list[float]) -> str:
    """``0.00: 0.9100, 0.05: ...``: a Dice curve over :data:`GAMMA_GRID`."""
    return ", ".join(f"{g:.2f}: {v:.4f}" for g, v in zip(GAMMA_GRID, values, strict=True))
