"""Learn which site each connected node is, by asking it."""

from __future__ import annotations

import dataclasses
import time
from logging import INFO

from flwr.app import Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from client_app import records
from fedsm_core.data.statistics import ChannelStatistics


@dataclasses.dataclass(frozen=True)
class SiteNode:
    """A connected node and the site it reported."""

    node_id: int
    site_index: int
    site_name: str
    num_train: int
    num_val: int
    num_test: int
    pixels: ChannelStatistics


def wait_for_nodes(grid: Grid, expected: int, timeout: float) -> list[int]:
    """Block until ``expected`` nodes are connected; raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while len(node_ids := list(grid.get_node_ids())) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {len(node_ids)} of {expected} nodes connected within {timeout:.0f} s; in simulation pass "
                f"--federation-config \"num-supernodes={expected}\", in deployment start one SuperNode per site"
            )
        log(INFO, "Waiting for nodes: %d of %d connected", len(node_ids), expected)
        time.sleep(1.0)
    return node_ids


def discover_sites(grid: Grid, site_names: tuple[str, ...], timeout: float) -> list[SiteNode]:
    """Ask every node for its site; one node per site, every site present.

    Raises
    ------
    RuntimeError
        When a node fails to answer, two nodes claim one site, or a site is missing.
    """
    node_ids = wait_for_nodes(grid, len(site_names), timeout)
    messages = [
        Message(
            RecordDict({records.CONFIG: records.to_config({records.ASK: records.ASK_SITE})}),
            message_type=MessageType.QUERY,
            dst_node_id=node,
        )
        for node in node_ids
    ]
    nodes: dict[int, SiteNode] = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node_id = reply.metadata.src_node_id
        if reply.has_error():
            raise RuntimeError(f"node {node_id} could not report its site: {reply.error.reason}")
        site = reply.content[records.SITE]
        index = int(site["site-index"])
        if index in nodes:
            raise RuntimeError(f"nodes {nodes[index].node_id} and {node_id} both report site '{site['site-name']}'")
        pixels = ChannelStatistics(
            int(site["pixel-count"]), tuple(site["pixel-mean"]), tuple(site["pixel-var"])  # type: ignore[arg-type]
        )
        nodes[index] = SiteNode(
            node_id, index, str(site["site-name"]), int(site["num-train"]), int(site["num-val"]), int(site["num-test"]),
            pixels,
        )
    missing = [name for index, name in enumerate(site_names) if index not in nodes]
    if missing:
        raise RuntimeError(f"no node answered for site(s) {missing}; each site needs one running SuperNode")
    for node in sorted(nodes.values(), key=lambda n: n.site_index):
        log(INFO, "Site %s on node %d: %d train / %d val / %d test images",
            node.site_name, node.node_id, node.num_train, node.num_val, node.num_test)
    return [nodes[index] for index in range(len(site_names))]
