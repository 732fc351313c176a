"""Which site a node is, and where its own data lies, from its node config."""

from __future__ import annotations

import pytest

from client_app.site import node_data_paths, node_device, resolve_site_index

SITES = ("siteA", "siteB", "siteC")


def test_no_data_path_means_no_override():
    assert node_data_paths({}) == {}
    assert node_data_paths({"site-name": "siteB"}) == {}
    assert node_data_paths({"partition-id": 1}) == {}


def test_data_path_maps_the_nodes_site_to_its_folder():
    config = {"site-name": "siteB", "data-path": "/data/prostate"}

    assert node_data_paths(config) == {"siteB": "/data/prostate"}


def test_data_path_without_site_name_is_an_error_telling_how_to_start_the_node():
    with pytest.raises(ValueError, match=r"data-path but no site-name.*site-name='<site>' data-path='<folder>'"):
        node_data_paths({"data-path": "/data/prostate", "partition-id": 0})


def test_site_name_wins_over_partition_id():
    assert resolve_site_index({"site-name": "siteC", "partition-id": 0}, SITES) == 2
    assert resolve_site_index({"partition-id": 1}, SITES) == 1


def test_unknown_site_name_and_out_of_range_partition_are_errors():
    with pytest.raises(ValueError, match=r"'siteD' is not a site.*\['siteA', 'siteB', 'siteC'\]"):
        resolve_site_index({"site-name": "siteD"}, SITES)
    with pytest.raises(ValueError, match="num-supernodes=3"):
        resolve_site_index({"partition-id": 3}, SITES)
    with pytest.raises(ValueError, match="neither 'site-name' nor 'partition-id'"):
        resolve_site_index({}, SITES)


def test_node_config_device_pins_this_node_and_wins_over_the_run_config():
    assert node_device({"site-name": "siteA", "device": "cuda:1"}, "auto") == "cuda:1"
    assert node_device({"site-name": "siteA"}, "auto") == "auto"
    assert node_device({"partition-id": 0}, "cpu") == "cpu"


def test_empty_node_config_device_tells_how_to_start_the_node():
    with pytest.raises(ValueError, match=r"node config device = '' is empty.*device='cuda:1'"):
        node_device({"site-name": "siteA", "device": " "}, "auto")
