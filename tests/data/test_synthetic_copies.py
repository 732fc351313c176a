"""synthetic-fundus-<K>: the six fundus profiles repeated with other seeds, as many sites as asked."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedsm_core.config import RunConfig
from fedsm_core.data.registry import dataset_info, training_dataset
from fedsm_core.data.synthetic_copies import fundus_site_count, generate_copy_site
from fedsm_core.data.synthetic_fundus import generate_site

SIZE, SCALE = 32, 0.05  # every site gets the minimum of 8 images


@pytest.mark.parametrize(("name", "expected"), [("synthetic-fundus-2", 2), ("synthetic-fundus-12", 12),
                                                ("synthetic-fundus", None), ("synthetic-prostate", None),
                                                ("synthetic-fundus-x", None)])
def test_site_count_of_a_name(name, expected):
    assert fundus_site_count(name) == expected


@pytest.mark.parametrize("name", ["synthetic-fundus-1", "synthetic-fundus-0", "synthetic-fundus-61"])
def test_counts_outside_the_range_are_refused_by_name_and_in_the_run_config(name):
    with pytest.raises(ValueError, match=r"must be in 2\.\.60"):
        fundus_site_count(name)
    with pytest.raises(ValueError, match=name):
        RunConfig.from_mapping({"dataset": name})


def test_twelve_sites_load_twelve_distinct_sites():
    # Prepare
    info = dataset_info("synthetic-fundus-12")

    # Execute
    sites = [info.load_site(i, SIZE, SCALE, 0) for i in range(info.num_sites)]

    # Assert
    assert info.num_sites == 12 and RunConfig.from_mapping({"dataset": "synthetic-fundus-12"})
    assert [s.name for s in sites] == [f"site-{i}" for i in range(1, 13)] == list(info.site_names)
    assert sites[7].train.ids[0] == "site-8/0000"
    for a, b in itertools.combinations(sites, 2):
        assert not np.array_equal(a.train.images, b.train.images), (a.name, b.name)


def test_the_first_six_sites_are_those_of_synthetic_fundus():
    for index in (0, 5):
        copy, original = generate_copy_site(index, SIZE, SCALE, 3), generate_site(index, SIZE, SCALE, 3)
        assert copy.name == original.name and copy.test.ids == original.test.ids
        np.testing.assert_array_equal(copy.test.images, original.test.images)


def test_a_repeat_has_its_profiles_size_and_a_shifted_seed():
    # Prepare: site 8 (index 7) repeats profile 1 (site-2) with seed + 1_000_003
    repeat, original = generate_copy_site(7, SIZE, 0.5, 0), generate_site(1, SIZE, 0.5, 1_000_003)

    # Assert
    assert [len(repeat.train), len(repeat.val), len(repeat.test)] == [len(original.train), len(original.val),
                                                                       len(original.test)]
    np.testing.assert_array_equal(repeat.train.images, original.train.images)
    assert repeat.name == "site-8" and original.name == "site-2"


def test_two_sites_hold_out_like_any_dataset():
    assert training_dataset("synthetic-fundus-4", "site-2").site_names == ("site-1", "site-3", "site-4")


def test_a_negative_index_is_refused():
    with pytest.raises(ValueError, match="site_index must be an integer >= 0, got -1"):
        generate_copy_site(-1)
