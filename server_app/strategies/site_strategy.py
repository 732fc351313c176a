"""What every strategy of this app shares: sites, reply checks, evaluation rounds."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from logging import INFO, WARNING

import numpy as np
from flwr.app import Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from app_protocol import records
from fedsm_core.algorithms.server_optimizer import ServerOptimizer
from fedsm_core.models.weights import Weights
from fedsm_core.run_files.run_outputs import pool_site_metrics
from server_app.discovery import SiteNode
from server_app.metric_bounds import checked_metrics
from server_app.round_plan import RoundPlan
from server_app.strategies.reply_checks import ReplyChecks
from server_app.traffic import RECEIVED, SENT, TrafficLog

EvaluationSink = Callable[[int, str, dict[str, dict[str, float]]], None]


def routed_site(message: Message) -> str:
    """The site a message the server sends is for (its ``route`` record)."""
    return str(records.decode_route(message.content))


class SiteStrategy(ReplyChecks):
    """Base of the strategies: one node per site, validated replies, federated evaluation.

    Not a subclass of Flower's ``Strategy``: its ``start()`` owns the round loop from
    round 1 with one ``ArrayRecord`` for every node, while a run here resumes after a
    checkpoint's round, stops by its stopping rule, and sends each site its own models
    (FedSM's personalized model, FedBN's normalization layers). The method names follow
    Flower's (``configure_train``, ``aggregate_train``, ``configure_evaluate``,
    ``aggregate_evaluate``), so a reader of ``flwr/serverapp/strategy/`` finds them.

    Subclasses build the per-site training messages and fold the replies in;
    this class checks replies (client errors, missing keys, wrong shapes,
    NaN/Inf values are rejected and logged, never averaged), keeps the log of
    which site missed which round, and runs evaluation every ``eval_every``
    rounds on the validation split.

    Parameters
    ----------
    nodes : sequence of SiteNode
        Node of each site, from :func:`server_app.discovery.discover_sites`.
    plan : RoundPlan
        Rounds, evaluation schedule, minimum replies, amplitude schedule.
    on_evaluate : callable
        Receives ``(round, split, per-site metrics)`` after each evaluation.
    """

    name = "base"

    def __init__(self, nodes: Sequence[SiteNode], plan: RoundPlan, on_evaluate: EvaluationSink) -> None:
        self.nodes = list(nodes)
        self.capped: list[tuple[int, str, int, int]] = []  # (round, site, claimed, reported) of capped counts
        self.left_out: list[tuple[int, str, str]] = []  # (round, site, model) the filtered mean left out
        self.node_of_site = {node.site_name: node.node_id for node in nodes}
        # Only a node that serves one site names it by itself; a simulated node may serve several.
        served = [node.node_id for node in nodes]
        self.site_of_node = {node.node_id: node.site_name for node in nodes if served.count(node.node_id) == 1}
        self.plan = plan
        self.state_key = plan.state_key
        self.eval_every = plan.eval_every
        self.num_rounds = plan.num_rounds
        self.on_evaluate = on_evaluate
        self.missed: list[tuple[int, str, str]] = []
        # Message id -> site it was sent to: the SuperLink answers for an unreachable node with an
        # error reply of its own (src node = the SuperLink), which only its reply-to id ties to a site.
        self.site_of_message: dict[str, str] = {}
        self.evaluation_gaps: dict[str, dict[str, str]] = {}  # split -> site -> why it has no result
        self.latest_lists: dict[str, dict[str, dict[str, list[float]]]] = {}
        self.traffic = TrafficLog()

    def run(self, grid: Grid, first_round: int, timeout: float, after_round: Callable[[int], bool]) -> None:
        """Rounds ``first_round .. num_rounds``: train, aggregate, evaluate, then ``after_round(r)``.

        A resumed run begins after its checkpoint's round. When
        ``after_round(r)`` returns true (the stopping rule held), training ends
        after round ``r``, which becomes ``num_rounds``: the test evaluation and
        the summary then name it.
        """
        self.summary()
        for server_round in range(first_round, self.num_rounds + 1):
            log(INFO, "[ROUND %d/%d]", server_round, self.num_rounds)
            with self.traffic.timed(server_round, "round"):
                replies = self.exchange(grid, self.configure_train(server_round), timeout,
                                        server_round)
                self.aggregate_train(server_round, replies)
                if self.evaluation_due(server_round):
                    self.prepare_evaluation(grid, server_round, timeout, "val")
                messages = list(self.configure_evaluate(server_round))
                if messages:
                    self.aggregate_evaluate(server_round, self.exchange(grid, messages, timeout, server_round))
            if after_round(server_round) and server_round < self.num_rounds:
                log(INFO, "Stopping after round %d of %d: validation has stopped improving (stop-* keys)",
                    server_round, self.num_rounds)
                self.num_rounds = server_round
                break
        self.finish_rounds(grid, timeout)

    def finish_rounds(self, grid: Grid, timeout: float) -> None:
        """After the last round, before the test: nothing here (FedSM fine-tunes after a stopped run's round)."""

    def exchange(self, grid: Grid, messages: Iterable[Message], timeout: float, server_round: int,
                 stage: str | None = None) -> list[Message]:
        """``grid.send_and_receive``, recording bytes per site and direction and the wall time in ``traffic``.

        ``stage`` labels the rows (default: the messages' type, ``train`` or ``evaluate``).
        """
        messages = list(messages)
        if not messages:
            return []
        stage = stage or messages[0].metadata.message_type
        self.traffic.add_messages(server_round, stage, SENT, messages, routed_site)  # before they leave
        with self.traffic.timed(server_round, stage):
            replies = list(grid.send_and_receive(messages, timeout=timeout))
        self.remember_destinations(messages)
        self.traffic.add_messages(server_round, stage, RECEIVED, replies, self.site_of)
        if stage == MessageType.TRAIN:
            self.traffic.add_site_seconds(server_round, replies, self.site_of)
        return self.in_site_order(replies)

    def in_site_order(self, replies: list[Message]) -> list[Message]:
        """``replies`` sorted by their site's position in the federation, whatever order they arrived in.

        Aggregation sums the replies in this order; floating-point sums depend on
        it, so a fixed order makes a run reproducible bit for bit (a resumed run,
        or a simulation with another number of nodes, ends with the same weights).
        """
        position = {node.site_name: index for index, node in enumerate(self.nodes)}
        return sorted(replies, key=lambda reply: position.get(self.site_of(reply), len(position)))

    def require_replies(self, server_round: int, accepted: int) -> None:
        """Stop the run when fewer than ``min_replies`` valid replies came in this round.

        The checkpoint of the previous round stays on disk, so the run can be
        resumed (``resume-from``) once the sites are back.
        """
        if accepted < self.plan.min_replies:
            raise RuntimeError(f"round {server_round}: {accepted} valid repl(ies), fewer than min-replies = "
                               f"{self.plan.min_replies}; see the log lines above. Resume from the last checkpoint "
                               "(resume-from) when enough sites are reachable")

    def fix_amplitude(self, server_round: int, site_weights: Sequence[Weights], sizes: Sequence[float],
                      models: dict[str, Weights]) -> dict[str, Weights]:
        """``models`` with HarmoFL's global amplitude fixed in, in the freeze round; otherwise unchanged.

        ``site_weights`` are the sites' trained global models of this round,
        whose amplitude entries hold each site's running average.
        """
        if self.plan.amplitude is None or not self.plan.amplitude.due(server_round):
            return models
        log(INFO, "round %d: %d sites' average amplitudes merged into the global amplitude, fixed from now on",
            server_round, len(site_weights))
        return self.plan.amplitude.fix(site_weights, sizes, models)

    def state_dict(self) -> dict[str, object]:
        """Everything needed to continue after the current round (see :mod:`fedsm_core.run_files.checkpoint`)."""
        return {"missed": [list(m) for m in self.missed], "latest-lists": self.latest_lists,
                "state-key": self.state_key, "left-out": [list(entry) for entry in self.left_out]}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s output."""
        self.missed = [(int(r), str(site), str(why)) for r, site, why in state["missed"]]
        self.latest_lists = state["latest-lists"]
        self.left_out = [(int(r), str(site), str(model)) for r, site, model in state.get("left-out", [])]
        # the sites keep their state under the original run's key (checkpoints before it had none)
        self.state_key = str(state.get("state-key", self.state_key))

    def summary(self) -> None:
        """Log the configuration."""
        log(INFO, "%s: %d sites %s, evaluation every %d round(s)", self.name, len(self.nodes),
            [n.site_name for n in self.nodes], self.eval_every)

    def remember_destinations(self, messages: Iterable[Message]) -> None:
        """Note the site of every sent message, by the id the grid gave it when pushing."""
        self.site_of_message = {message.metadata.message_id: routed_site(message)
                                for message in messages if message.metadata.message_id}

    def site_of(self, reply: Message) -> str:
        """The site whose message ``reply`` answers (also when the SuperLink answered for it)."""
        site = self.site_of_message.get(reply.metadata.reply_to_message_id)
        if site is not None:
            return site
        return self.site_of_node.get(reply.metadata.src_node_id, f"node {reply.metadata.src_node_id}")

    def error_reason(self, reply: Message) -> str:
        """Why an error reply carries no result: the site's own error, or the SuperLink's word that it is gone."""
        if reply.metadata.src_node_id in self.site_of_node:
            return f"client error: {reply.error.reason}"
        return f"unreachable, the SuperLink answered for it: {reply.error.reason}"

    def note_left_out(self, server_round: int, sites: Sequence[str], optimizer: ServerOptimizer, model: str) -> None:
        """Log each reply's filter scores; log and remember the replies the filtered mean left out of ``model``.

        ``sites`` name the replies ``optimizer`` aggregated last, in its order.
        """
        if optimizer.scores:
            log(INFO, "round %d: filtered mean of the %s, distance / median distance and update cosine: %s",
                server_round, model, ", ".join(f"{site} {ratio:.2f} {cosine:+.2f}"
                                               for site, (ratio, cosine) in zip(sites, optimizer.scores, strict=True)))
        for index in optimizer.left_out:
            memory = (f", or far on average: filter-memory, mean distance ratio "
                      f"{optimizer.memory.mean_ratio(sites[index]):.2f}" if optimizer.aggregation.filter_memory else "")
            log(WARNING, "round %d: %s's %s left out of the filtered mean (far from the other sites', or pointing "
                "elsewhere: filter-min-cosine%s)", server_round, sites[index], model, memory)
            self.left_out.append((server_round, sites[index], model))

    def note_absent(self, server_round: int, replied: Iterable[str]) -> None:
        """Record sites that sent no reply at all this round."""
        answered = set(replied) | {site for r, site, _ in self.missed if r == server_round}
        for node in self.nodes:
            if node.site_name not in answered:
                self.missed.append((server_round, node.site_name, "no reply"))

    def messages(self, contents: dict[str, RecordDict], message_type: str) -> list[Message]:
        """One message per site (name -> content), to the site's node and naming the site."""
        return [Message(records.with_route(content, site, self.state_key), message_type=message_type,
                        dst_node_id=self.node_of_site[site]) for site, content in contents.items()]

    def configure_evaluate(self, server_round: int) -> Iterable[Message]:
        """Validation-split evaluation every ``eval_every`` rounds and in the last round."""
        if not self.evaluation_due(server_round):
            return []
        return self.evaluation_messages("val")

    def evaluation_due(self, server_round: int) -> bool:
        """Whether round ``server_round`` ends with a validation evaluation (every ``eval_every`` and the last)."""
        return server_round % self.eval_every == 0 or server_round == self.num_rounds

    def prepare_evaluation(self, grid: Grid, server_round: int, timeout: float, split: str) -> None:
        """Work before an evaluation of ``split``; none by default.

        FedSM fits its selector head before each validation round (the last
        round is always evaluated, so the head also holds for the test
        evaluation and the saved models) and asks each site which
        personalized models its images need, so only those are sent.
        """

    def evaluation_messages(self, split: str) -> list[Message]:
        """Messages that evaluate the current models on ``split`` at every site."""
        content = self.evaluation_content(split)
        return self.messages({node.site_name: content for node in self.nodes}, MessageType.EVALUATE)

    def evaluation_content(self, split: str) -> RecordDict:
        """The records an evaluation message carries; subclasses define it."""
        raise NotImplementedError

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Collect per-site validation metrics; return the pooled ones."""
        return self.collect_evaluation(server_round, "val", replies)

    def collect_evaluation(self, server_round: int, split: str, replies: Iterable[Message]) -> MetricRecord | None:
        """Per-site metrics of an evaluation round, passed to ``on_evaluate``; pooled values returned."""
        per_site: dict[str, dict[str, float]] = {}
        lists: dict[str, dict[str, list[float]]] = {}
        gaps: dict[str, str] = {}
        for reply in replies:
            site = self.site_of(reply)
            try:
                if reply.has_error():
                    raise ValueError(self.error_reason(reply))
                per_site[site], lists[site] = checked_metrics(reply.content, self.reported_images(site, split))
            except ValueError as error:  # an error reply, or metrics no evaluation can produce
                gaps[site] = str(error)
                log(WARNING, "round %d: %s evaluation of %s failed (%s)", server_round, split, site, gaps[site])
        self.latest_lists[split] = lists
        gaps.update({node.site_name: "no reply" for node in self.nodes
                     if node.site_name not in per_site and node.site_name not in gaps})
        self.evaluation_gaps[split] = gaps
        if not per_site:
            return None
        if split == "val":
            self.restate_validation(per_site, lists)
        ordered = {node.site_name: per_site[node.site_name] for node in self.nodes if node.site_name in per_site}
        self.on_evaluate(server_round, split, ordered)
        return records.to_metrics(pool_site_metrics(ordered))

    def reported_images(self, site: str, split: str) -> int | None:
        """The images of ``split`` that ``site`` reported at discovery (None for a site not in the run)."""
        node = next((n for n in self.nodes if n.site_name == site), None)
        return None if node is None else {"val": node.num_val, "test": node.num_test}.get(split)

    def restate_validation(self, per_site: dict[str, dict[str, float]],
                           lists: dict[str, dict[str, list[float]]]) -> None:
        """Adjust a validation round's per-site metrics in place before they are recorded; nothing by default.

        FedSM chooses gamma here and restates the super model's metrics at it.
        """

    def finish_validation(self) -> list[str]:
        """Called after the last round, before the test evaluation; returns notes for the summary.

        Strategies that choose settings on validation data (FedSM's gamma) do it here.
        """
        return []

    def mean_metrics(self, replies: Sequence[Message]) -> MetricRecord:
        """Mean of the clients' training metrics (losses, steps)."""
        values: dict[str, list[float]] = {}
        for reply in replies:
            for key, value in reply.content[records.METRICS].items():
                values.setdefault(key, []).append(float(value))
        return records.to_metrics({key: float(np.mean(v)) for key, v in values.items()})
