"""Which node serves which site: by the node's own site name, or shared out in simulation.

Two kinds of nodes answer the server's ``ask = node`` query:

- a *named* node (deployment): its node config says ``site-name``; it serves
  that site and no other, and two nodes may not name one site;
- a *simulated* node: the simulation engine gives it ``partition-id`` and
  ``num-partitions`` (N). Site ``k`` of K goes to the node of partition
  ``k mod N``, so any number of simulated SuperNodes serves every site: with
  N < K a node serves several sites (each message names its site), with
  N > K some nodes stay idle. The result depends only on K and N.
  Once the sites have reported their sizes, :func:`order_longest_first`
  deals them out again, largest first (see there why).

A federation of both kinds, or a node of neither, is an error that says how
to start the nodes. This module does no messaging: it maps answers to sites.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Assignment:
    """The node of each site found so far.

    Attributes
    ----------
    node_of_site : dict
        Site index -> node id.
    missing : tuple of str
        Names of the sites no node serves yet (named nodes may still connect).
    simulated : bool
        Whether the nodes are simulated ones.
    num_partitions : int or None
        N, the number of simulated nodes (None for named nodes).
    """

    node_of_site: dict[int, int]
    missing: tuple[str, ...]
    simulated: bool
    num_partitions: int | None = None


def _assign_named(identities: Mapping[int, Mapping[str, object]], site_names: tuple[str, ...]) -> Assignment:
    node_of_site: dict[int, int] = {}
    for node_id, identity in sorted(identities.items()):
        name = str(identity["site-name"])
        if name not in site_names:
            raise ValueError(f"node {node_id} was started as site '{name}', which is not a site of the dataset "
                             f"{list(site_names)}; restart it with --node-config \"site-name='<one of these>'\"")
        index = site_names.index(name)
        if index in node_of_site:
            raise ValueError(f"nodes {node_of_site[index]} and {node_id} were both started as site '{name}'; "
                             "start exactly one SuperNode per site")
        node_of_site[index] = node_id
    missing = tuple(name for index, name in enumerate(site_names) if index not in node_of_site)
    return Assignment(node_of_site, missing, simulated=False)


def _assign_simulated(identities: Mapping[int, Mapping[str, object]], site_names: tuple[str, ...]) -> Assignment:
    counts = {int(identity["num-partitions"]) for identity in identities.values()}  # type: ignore[arg-type]
    if len(counts) != 1:
        raise ValueError(f"simulated nodes disagree on num-partitions {sorted(counts)}")
    count = counts.pop()
    node_of_partition = {int(identity["partition-id"]): node for node, identity in identities.items()}  # type: ignore[arg-type]
    # A partition whose node has not registered yet leaves its sites missing for now.
    node_of_site = {index: node_of_partition[index % count] for index in range(len(site_names))
                    if index % count in node_of_partition}
    missing = tuple(name for index, name in enumerate(site_names) if index not in node_of_site)
    return Assignment(node_of_site, missing, simulated=True, num_partitions=count)


def order_longest_first(assignment: Assignment, work: Mapping[int, int]) -> Assignment:
    """Deal simulated sites out again, most ``work`` first: the j-th largest goes to partition ``j mod N``.

    Flower's simulation engine queues each round's messages in partition order
    and its workers take them first come, first served. In site order a large
    site may start last and keep one worker busy while the others are idle.
    Largest first is Graham's LPT rule: the round takes at most
    ``4/3 - 1/(3W)`` times the best possible schedule on ``W`` workers.
    With fewer nodes than sites, a node's own sites leave in the order the
    server sent them; the default simulation has one node per site.

    Parameters
    ----------
    assignment : Assignment
        A complete assignment from :func:`assign_sites`. Named nodes serve their
        own site, so an assignment of named nodes is returned unchanged.
    work : Mapping[int, int]
        Site index -> its amount of work (its training images); ties keep site order.
    """
    if not assignment.simulated or assignment.num_partitions is None or assignment.missing:
        return assignment
    count = assignment.num_partitions
    # With the sites in index order, partition p (p < K) serves site p first.
    node_of_partition = {p: assignment.node_of_site[p] for p in range(min(count, len(assignment.node_of_site)))}
    ranked = sorted(assignment.node_of_site, key=lambda index: (-work[index], index))
    node_of_site = {index: node_of_partition[rank % count] for rank, index in enumerate(ranked)}
    return dataclasses.replace(assignment, node_of_site=node_of_site)


def assign_sites(identities: Mapping[int, Mapping[str, object]], site_names: tuple[str, ...]) -> Assignment:
    """Map the sites to the nodes that answered (node id -> identity from ``ask = node``).

    Raises
    ------
    ValueError
        For a node of neither kind, a mix of kinds, an unknown or twice-named
        site, or simulated nodes that disagree on their number; the message
        names the node and the fix.
    """
    if not identities:
        raise ValueError("no node answered; start the SuperNodes (or the simulation) first")
    named = {node for node, identity in identities.items() if "site-name" in identity}
    simulated = {node for node, identity in identities.items() if "partition-id" in identity}
    unknown = sorted(set(identities) - named - simulated)
    if unknown:
        raise ValueError(f"nodes {unknown} name neither a site nor a partition; start each SuperNode with "
                         "--node-config \"site-name='<site>'\"")
    if named and simulated:
        raise ValueError(f"nodes {sorted(named)} name their site but nodes {sorted(simulated)} are simulated "
                         "partitions; use one kind: all SuperNodes with site-name (deployment) or a simulation")
    return _assign_named(identities, site_names) if named else _assign_simulated(identities, site_names)
