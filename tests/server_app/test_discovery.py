"""Which node is which site: a site is whoever holds a registered key and claims its name.

The SuperLink authenticates keys, not site names, so two registered nodes could both
claim one site; the run must stop and name both nodes instead of training with either.
"""

from __future__ import annotations

import pytest
from support.server_fakes import ScriptedGrid

from app_protocol import records
from server_app.discovery import discover_sites

SITES = ("north", "south")


def _deployment(claims: dict[int, int | None]) -> ScriptedGrid:
    """Deployment nodes named by their node config: node id -> the site index it names (None: never answers)."""

    def answer(message):
        index = claims[message.metadata.dst_node_id]
        if index is None:
            return None
        asked = message.content[records.CONFIG][records.ASK]
        return {records.NODE: records.to_config({"site-name": SITES[index]})} if asked == records.ASK_NODE \
            else {records.SITE: _site(index)}

    return ScriptedGrid(answer, node_ids=claims)


def _site(index: int):
    return records.to_config({
        "site-index": index, "site-name": SITES[index], "num-train": 4, "num-val": 1, "num-test": 1,
        "pixel-count": 16, "pixel-mean": [0.5, 0.5, 0.5], "pixel-var": [0.1, 0.1, 0.1],
    })


def test_each_site_claimed_once_maps_nodes_to_sites():
    # Execute
    nodes = discover_sites(_deployment({21: 1, 11: 0}), SITES, timeout=1)

    # Assert
    assert [(node.node_id, node.site_name) for node in nodes] == [(11, "north"), (21, "south")]


def test_two_nodes_claiming_one_site_stop_the_run_and_name_both():
    # Execute / Assert
    with pytest.raises(ValueError, match=r"nodes 11 and 12 were both started as site 'north'"):
        discover_sites(_deployment({11: 0, 12: 0, 21: 1}), SITES, timeout=1)


def test_a_site_nobody_claims_stops_the_run():
    # Execute / Assert: node 12 is connected but does not answer
    with pytest.raises(RuntimeError, match=r"did not answer"):
        discover_sites(_deployment({11: 0, 12: None}), SITES, timeout=1)


def test_a_simulation_only_setting_stops_a_run_of_deployment_supernodes_before_any_site_is_asked():
    grid = _deployment({11: 0, 21: 1})

    with pytest.raises(ValueError, match="attack = 'site-2:noise' runs only in the simulation"):
        discover_sites(grid, SITES, timeout=1, simulation_only="attack = 'site-2:noise'")

    assert all(sent.site is None for sent in grid.sent)  # only "who are you" was asked
