"""Learn which node serves which site, by asking the nodes, then ask each site for its data summary."""

from __future__ import annotations

import dataclasses
import time
from logging import INFO

from flwr.app import Message, MessageType
from flwr.common import log
from flwr.serverapp import Grid

from app_protocol import records
from app_protocol.evaluate_messages import decode_node_reply, decode_site_reply, encode_query
from fedsm_core.data.statistics import ChannelStatistics
from server_app.site_assignment import Assignment, assign_sites, order_longest_first

POLL_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class SiteNode:
    """A site and the node that serves it (in simulation one node may serve several sites)."""

    node_id: int
    site_index: int
    site_name: str
    num_train: int
    num_val: int
    num_test: int
    pixels: ChannelStatistics


def _query(node_id: int, ask: str, site: str | None = None) -> Message:
    content = encode_query(ask) if site is None else records.with_route(encode_query(ask), site)
    return Message(content, message_type=MessageType.QUERY, dst_node_id=node_id)


def ask_identities(grid: Grid, node_ids: list[int], timeout: float) -> dict[int, dict[str, object]]:
    """Node id -> what the node says it is (``site-name``, or ``partition-id`` and ``num-partitions``)."""
    identities: dict[int, dict[str, object]] = {}
    for reply in grid.send_and_receive([_query(node, records.ASK_NODE) for node in node_ids], timeout=timeout):
        node_id = reply.metadata.src_node_id
        if reply.has_error():
            raise RuntimeError(f"node {node_id} could not say which site it serves: {reply.error.reason}")
        identities[node_id] = decode_node_reply(reply.content)
    silent = sorted(set(node_ids) - set(identities))
    if silent:
        raise RuntimeError(f"nodes {silent} did not answer within {timeout:.0f} s")
    return identities


def assign_nodes(grid: Grid, site_names: tuple[str, ...], timeout: float) -> Assignment:
    """Ask every connected node who it is until each site has a node; raise after ``timeout`` seconds.

    Simulated nodes serve every site at once (:mod:`server_app.site_assignment`);
    named nodes (deployment) may connect one by one, so the sites still missing
    are logged by name while waiting.
    """
    deadline = time.monotonic() + timeout
    identities: dict[int, dict[str, object]] = {}
    while True:
        new = [node for node in grid.get_node_ids() if node not in identities]
        if new:
            identities.update(ask_identities(grid, new, timeout))
        if identities:
            assignment = assign_sites(identities, site_names)
            if not assignment.missing:
                return assignment
            waiting = f"no node for site(s) {list(assignment.missing)}"
        else:
            waiting = "no node connected"
        if time.monotonic() > deadline:
            raise RuntimeError(f"{waiting} within {timeout:.0f} s; in deployment start one SuperNode per site with "
                               "--node-config \"site-name='<site>'\"")
        log(INFO, "Waiting for nodes: %s", waiting)
        time.sleep(POLL_SECONDS)


def discover_sites(grid: Grid, site_names: tuple[str, ...], timeout: float,
                   simulation_only: str = "") -> list[SiteNode]:
    """The node of every site, with each site's split sizes and pixel statistics.

    ``simulation_only`` names a setting that runs only in the simulation (the
    attack simulator); deployment SuperNodes then stop the run before any
    site is asked for data.

    Raises
    ------
    RuntimeError
        When a node or site fails to answer, or no node serves a site within ``timeout``.
    ValueError
        For nodes that cannot serve the dataset (see :func:`server_app.site_assignment.assign_sites`).
    """
    assignment = assign_nodes(grid, site_names, timeout)
    if simulation_only and not assignment.simulated:
        raise ValueError(f"{simulation_only} runs only in the simulation, but these nodes are deployment "
                         "SuperNodes (their node config names their site); remove it from the run config")
    messages = [_query(node, records.ASK_SITE, site_names[index])
                for index, node in sorted(assignment.node_of_site.items())]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    site_of_message = {m.metadata.message_id: i for m, i in zip(messages, sorted(assignment.node_of_site), strict=True)}
    sites: dict[int, SiteNode] = {}
    for reply in replies:
        index = site_of_message.get(reply.metadata.reply_to_message_id)
        if reply.has_error():
            name = site_names[index] if index is not None else f"node {reply.metadata.src_node_id}"
            raise RuntimeError(f"site {name} could not report its data: {reply.error.reason}")
        site = decode_site_reply(reply.content)
        index = int(site["site-index"])
        pixels = ChannelStatistics(
            int(site["pixel-count"]), tuple(site["pixel-mean"]), tuple(site["pixel-var"])  # type: ignore[arg-type]
        )
        sites[index] = SiteNode(assignment.node_of_site[index], index, str(site["site-name"]), int(site["num-train"]),
                                int(site["num-val"]), int(site["num-test"]), pixels)
    missing = [name for index, name in enumerate(site_names) if index not in sites]
    if missing:
        raise RuntimeError(f"no answer from site(s) {missing} within {timeout:.0f} s")
    # In simulation any node serves any site: re-deal them so the largest sites are dispatched first.
    assignment = order_longest_first(assignment, {index: site.num_train for index, site in sites.items()})
    sites = {index: dataclasses.replace(site, node_id=assignment.node_of_site[index]) for index, site in sites.items()}
    kind = "simulated node" if assignment.simulated else "node"
    for node in sorted(sites.values(), key=lambda n: n.site_index):
        log(INFO, "Site %s on %s %d: %d train / %d val / %d test images",
            node.site_name, kind, node.node_id, node.num_train, node.num_val, node.num_test)
    return [sites[index] for index in range(len(site_names))]
