"""A simulated node serves the site each message names; per-site state stays per site."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, Message, MessageType, RecordDict

from app_protocol import records
from client_app import app as client
from client_app.site import node_identity, site_of_message
from client_app.site_state import load_site_state, save_site_state
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import dataset_info
from fedsm_core.models.weights import get_weights

TINY = {"image-size": 32, "data-scale": 0.1, "max-local-steps": 1, "selector-width": 4, "batch-size": 4,
        "strategy": "scaffold"}
NAMES = dataset_info("synthetic-fundus").site_names


def routed(content: dict, site: str, message_type: str) -> Message:
    return Message(RecordDict({**content, records.ROUTE: records.to_config({"site-name": site})}),
                   message_type=message_type, dst_node_id=7)


def test_the_route_names_the_site_and_must_agree_with_a_named_supernode():
    assert site_of_message({"site-name": "site-4"}, {"partition-id": 0}, NAMES) == 3
    assert site_of_message(None, {"partition-id": 1}, NAMES) == 1   # a message without a route: the node's site
    with pytest.raises(ValueError, match="this SuperNode is site 'site-1'.*for site 'site-2'"):
        site_of_message({"site-name": "site-2"}, {"site-name": "site-1"}, NAMES)
    with pytest.raises(ValueError, match="'site-9', which is not a site"):
        site_of_message({"site-name": "site-9"}, {}, NAMES)


def test_a_node_says_whether_it_is_a_named_site_or_a_simulated_partition():
    assert node_identity({"site-name": "site-2", "partition-id": 0}) == {"site-name": "site-2"}
    assert node_identity({"partition-id": 1, "num-partitions": 2}) == {"partition-id": 1, "num-partitions": 2}
    with pytest.raises(ValueError, match="--node-config"):
        node_identity({})


def test_two_sites_on_one_node_keep_their_own_control_variates():
    # Prepare: one node (partition 0 of 2) serves site-1 and site-3
    context = Context(run_id=5, node_id=7, node_config={"partition-id": 0, "num-partitions": 2},
                      state=RecordDict(), run_config=TINY)
    spec = RunConfig.from_mapping(TINY).model_spec(2, len(NAMES))
    model = spec.build_segmentation()
    content = {records.GLOBAL: records.to_record(get_weights(model)),
               records.CONFIG: records.to_config({"server-round": 1}),
               records.SERVER_CONTROL: records.to_record(
                   {name: np.zeros(tuple(p.shape), np.float32) for name, p in model.named_parameters()})}

    # Execute
    first = client.train(routed(content, "site-1", MessageType.TRAIN), context)
    third = client.train(routed(content, "site-3", MessageType.TRAIN), context)

    # Assert: each site's c_k is its own delta from zero (round 1), kept apart though the node is one
    for site, reply in (("site-1", first), ("site-3", third)):
        stored = load_site_state(5, site, records.CLIENT_CONTROL_STATE)
        delta = records.from_record(reply.content[records.CONTROL_DELTA])
        for name, value in delta.items():
            np.testing.assert_array_equal(stored[name], value)
    name = next(iter(records.from_record(first.content[records.CONTROL_DELTA])))
    assert not np.array_equal(load_site_state(5, "site-1", records.CLIENT_CONTROL_STATE)[name],
                              load_site_state(5, "site-3", records.CLIENT_CONTROL_STATE)[name])


def test_the_query_answers_for_the_routed_site():
    context = Context(run_id=5, node_id=7, node_config={"partition-id": 0, "num-partitions": 2},
                      state=RecordDict(), run_config=TINY)

    node = client.query(Message(RecordDict({records.CONFIG: records.to_config({"ask": "node"})}),
                                message_type=MessageType.QUERY, dst_node_id=7), context)
    site = client.query(routed({records.CONFIG: records.to_config({"ask": "site"})}, "site-5", MessageType.QUERY),
                        context)

    assert dict(node.content[records.NODE]) == {"partition-id": 0, "num-partitions": 2}
    assert site.content[records.SITE]["site-name"] == "site-5" and site.content[records.SITE]["site-index"] == 4


def test_site_state_round_trips_and_is_absent_before_the_first_save():
    assert load_site_state(9, "site-1", "k") is None
    save_site_state(9, "site-1", "k", {"a.b": np.arange(3.0)})

    np.testing.assert_array_equal(load_site_state(9, "site-1", "k")["a.b"], [0.0, 1.0, 2.0])
    assert load_site_state(9, "site-2", "k") is None
