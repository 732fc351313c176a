"""FedSM's fitted selector head over the grid: every site's embedding statistics, checked, then one fit.

With ``selector-head = fitted``, before each validation the server sends the
selector to every site; each answers with the sums of its embeddings
(:func:`~fedsm_core.algorithms.fedsm.selector_head.selector_statistics`), and
the head is fitted from them
(:meth:`~fedsm_core.algorithms.fedsm.fedsm.FedSM.fit_selector_head`). A site
without accepted statistics gets a *closed route*: no image goes to its
personalized model in this evaluation, and its validation scores take no part
in choosing gamma (``FedSMStrategy.restate_validation``).

Three things close a route: no reply; a reply the checks reject (shape,
finiteness, positive semi-definiteness, a count that does not match the
site's reported training images); and a site the filtered mean's memory leaves
out of the global model (``filter-memory``: its updates lie more than
``filter-factor`` typical distances from the others' on average). The last
needs no look at the statistics: a site that trains on wrong masks (label
flipping) sends plausible statistics, but its personalized model, trained the
same way, is no safer to route images to, and its validation images, routed
to that model, would otherwise choose the global model for everyone
(``docs/results.md``, robustness, FedSM on ``synthetic-fundus``).
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import TYPE_CHECKING

from flwr.app import MessageType
from flwr.common import log
from flwr.serverapp import Grid

from app_protocol import records
from app_protocol.evaluate_messages import decode_statistics_reply, encode_query
from fedsm_core.algorithms.fedsm.selector_head import SelectorStatistics

if TYPE_CHECKING:  # the strategy imports this module
    from server_app.strategies.fedsm import FedSMStrategy


def fit_selector_head(strategy: FedSMStrategy, grid: Grid, server_round: int, timeout: float) -> frozenset[str]:
    """Fit the selector's head from the sites' accepted statistics; return the sites whose routes are closed.

    With fewer than two accepted sites the trained head is kept and no route
    is closed. Every closed route is recorded in ``strategy.closed_routes``
    (round, why) for the run's summary.
    """
    statistics = query_statistics(strategy, grid, server_round, timeout)
    set_aside_far_sites(strategy, server_round, statistics)
    try:
        closed = strategy.fedsm.fit_selector_head(statistics, strategy.selector_shrinkage)
    except ValueError as error:
        log(WARNING, "round %d: selector head kept as trained: %s", server_round, error)
        return frozenset()
    log(INFO, "round %d: selector head fitted from %d sites' embedding statistics", server_round, len(statistics))
    for site in closed:  # a site that sent nothing is recorded as one whose reply was rejected
        events = strategy.closed_routes.setdefault(site, [])
        if not events or events[-1][0] != server_round:
            events.append((server_round, "no reply"))
    if closed:
        log(WARNING, "round %d: no images are routed to the personalized models of %s (no accepted selector "
            "statistics this round)", server_round, ", ".join(closed))
    return frozenset(closed)


def query_statistics(strategy: FedSMStrategy, grid: Grid, server_round: int,
                     timeout: float) -> dict[str, SelectorStatistics]:
    """Ask every site for its embedding statistics; site -> the statistics that pass the checks."""
    content = encode_query(records.SELECTOR_STATISTICS, strategy.fedsm.selector_weights)
    messages = strategy.messages({node.site_name: content for node in strategy.nodes}, MessageType.QUERY)
    statistics: dict[str, SelectorStatistics] = {}
    for reply in strategy.exchange(grid, messages, timeout, server_round, stage="selector-head"):
        site = strategy.site_of(reply)
        try:
            if reply.has_error():
                raise ValueError(f"client error: {reply.error.reason}")
            received = SelectorStatistics.from_arrays(decode_statistics_reply(reply.content))
            if strategy.statistics_views is not None:
                trained = next(node.num_train for node in strategy.nodes if node.site_name == site)
                received.check_count(trained * strategy.statistics_views)
            statistics[site] = received
        except (KeyError, ValueError) as error:
            log(WARNING, "round %d: selector statistics of %s rejected (%s)", server_round, site, error)
            strategy.closed_routes.setdefault(site, []).append((server_round, str(error)))
    return statistics


def set_aside_far_sites(strategy: FedSMStrategy, server_round: int,
                        statistics: dict[str, SelectorStatistics]) -> None:
    """Remove from ``statistics`` the sites the filter memory leaves out of the global model, and record why.

    Under ``aggregation = "filtered-mean"`` with ``filter-memory``, a site
    ``k`` is far when ``mean_{s <= t} d_k(s) / median_j d_j(s) > c`` (``c`` the
    ``filter-factor``; :mod:`~fedsm_core.algorithms.filter_memory`); under
    any other aggregation no site is.
    """
    optimizer = strategy.fedsm.global_optimizer
    for site in optimizer.far_sites(strategy.fedsm.site_names):
        why = (f"filter memory: its global-model updates lie {optimizer.memory.mean_ratio(site):.2f} typical "
               f"distances out on average (filter-factor {optimizer.aggregation.filter_factor:g})")
        log(WARNING, "round %d: selector statistics of %s set aside (%s)", server_round, site, why)
        statistics.pop(site, None)
        strategy.closed_routes.setdefault(site, []).append((server_round, why))
