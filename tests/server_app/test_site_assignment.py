"""Which node serves which site: shared out in simulation, named in deployment; discovery through a fake grid."""

from __future__ import annotations

import pytest
from support.server_fakes import ScriptedGrid

from app_protocol import records
from server_app.discovery import discover_sites
from server_app.site_assignment import assign_sites, order_longest_first

SITES = tuple(f"site-{k}" for k in range(1, 7))


def simulated(count: int) -> dict[int, dict[str, object]]:
    """``count`` simulated nodes with ids 100 + partition."""
    return {100 + p: {"partition-id": p, "num-partitions": count} for p in range(count)}


@pytest.mark.parametrize(("nodes", "expected"), [
    (2, [100, 101, 100, 101, 100, 101]),    # site k -> partition k mod 2
    (6, [100, 101, 102, 103, 104, 105]),    # one node per site
    (8, [100, 101, 102, 103, 104, 105]),    # nodes 106 and 107 stay idle
    (1, [100] * 6),
])
def test_any_number_of_simulated_nodes_serves_every_site(nodes, expected):
    assignment = assign_sites(simulated(nodes), SITES)

    assert [assignment.node_of_site[k] for k in range(6)] == expected
    assert assignment.missing == () and assignment.simulated


def test_a_simulated_node_that_has_not_registered_leaves_its_sites_missing():
    identities = simulated(2)
    del identities[101]

    assert assign_sites(identities, SITES).missing == ("site-2", "site-4", "site-6")


def test_named_nodes_serve_their_own_site_and_the_others_are_missing():
    assignment = assign_sites({7: {"site-name": "site-3"}, 9: {"site-name": "site-1"}}, SITES)

    assert assignment.node_of_site == {2: 7, 0: 9}
    assert assignment.missing == ("site-2", "site-4", "site-5", "site-6") and not assignment.simulated


@pytest.mark.parametrize(("identities", "match"), [
    ({7: {"site-name": "nowhere"}}, r"node 7 was started as site 'nowhere'.*--node-config"),
    ({7: {"site-name": "site-1"}, 8: {"site-name": "site-1"}}, r"nodes 7 and 8 were both started as site 'site-1'"),
    ({7: {"site-name": "site-1"}, 8: {"partition-id": 0, "num-partitions": 2}}, "use one kind"),
    ({7: {}}, r"nodes \[7\] name neither a site nor a partition"),
    ({}, "no node answered"),
])
def test_nodes_that_cannot_serve_the_dataset_fail_at_once_naming_the_fix(identities, match):
    with pytest.raises(ValueError, match=match):
        assign_sites(identities, SITES)


@pytest.mark.parametrize(("nodes", "expected"), [
    # sizes 30, 10, 50, 20, 40, 60: largest first is site-6, site-3, site-5, site-1, site-4, site-2
    (2, [101, 101, 101, 100, 100, 100]),     # ranks 3, 5, 1, 4, 2, 0 -> partition rank mod 2
    (6, [103, 105, 101, 104, 102, 100]),    # one node per site, the largest on partition 0
    (8, [103, 105, 101, 104, 102, 100]),    # nodes 106 and 107 stay idle as before
    (1, [100] * 6),
])
def test_simulated_sites_are_dealt_out_largest_first(nodes, expected):
    work = dict(enumerate([30, 10, 50, 20, 40, 60]))

    ordered = order_longest_first(assign_sites(simulated(nodes), SITES), work)

    assert [ordered.node_of_site[k] for k in range(6)] == expected
    assert ordered.missing == () and ordered.simulated and ordered.num_partitions == nodes


def test_equal_sites_keep_site_order_and_named_nodes_keep_their_site():
    assignment = assign_sites(simulated(6), SITES)
    assert order_longest_first(assignment, dict.fromkeys(range(6), 7)) == assignment

    named = assign_sites({200 + k: {"site-name": name} for k, name in enumerate(SITES)}, SITES)
    assert order_longest_first(named, dict(enumerate([1, 2, 3, 4, 5, 6]))) == named


def _simulated_node(message):
    """Two simulated nodes (100, 101) answer who they are and, per routed site, a made-up data summary."""
    node = message.metadata.dst_node_id
    if message.content[records.CONFIG]["ask"] == "node":
        return {records.NODE: records.to_config({"partition-id": node - 100, "num-partitions": 2})}
    site = str(message.content[records.ROUTE]["site-name"])
    return {records.SITE: records.to_config({
        "site-index": SITES.index(site), "site-name": site, "num-train": 10 + SITES.index(site),
        "num-val": 2, "num-test": 2, "pixel-count": 1, "pixel-mean": [0.0], "pixel-var": [1.0]})}


def test_discovery_with_two_simulated_nodes_asks_each_site_through_its_node():
    grid = ScriptedGrid(_simulated_node, node_ids=[100, 101])

    nodes = discover_sites(grid, SITES, timeout=5.0)

    # asked through node k mod 2, then dealt out largest first: site-6 (15 images) on partition 0
    site_queries = [(sent.node, sent.site) for sent in grid.sent if sent.site]
    assert sorted(site_queries) == [(100, "site-1"), (100, "site-3"), (100, "site-5"),
                                         (101, "site-2"), (101, "site-4"), (101, "site-6")]
    assert [(n.site_name, n.node_id, n.num_train) for n in nodes] == [
        ("site-1", 101, 10), ("site-2", 100, 11), ("site-3", 101, 12),
        ("site-4", 100, 13), ("site-5", 101, 14), ("site-6", 100, 15)]
