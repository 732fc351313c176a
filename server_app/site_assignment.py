"""Which node serves which site: by the node's own site name, or shared out in simulation.

Two kinds of nodes answer the server's ``ask = node`` query:

- a *named* node (deployment): its node config says ``site-name``; it serves
  that site and no other, and two nodes may not name one site;
- a *simulated* node: the simulation engine gives it ``partition-id`` and
  ``num-partitions`` (N). Site ``k`` of K goes to the node of partition
  ``k mod N``, so any number of simulated SuperNodes serves every site: with
  N < K a node serves several sites (each message names its site), with
  N > K some nodes stay idle. The result depends only on K and N.

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
    """

    node_of_site: dict[int, int]
    missing: tuple[str, ...]
    simulated: bool


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
    return Assignment(node_of_site, missing, simulated=True)


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
