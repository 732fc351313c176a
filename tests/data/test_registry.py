"""The dataset registry: registered datasets and holding a site out of training."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SegArrays, SiteSplits
from fedsm_core.data.registry import DATASETS, DatasetInfo, dataset_info, dataset_label, hold_out, training_dataset
from fedsm_core.data.synthetic_prostate import PROSTATE_SITES


def recording_info(names: tuple[str, ...]) -> tuple[DatasetInfo, list[tuple]]:
    """A dataset whose loader records its calls and names each split after the site index."""
    calls: list[tuple] = []

    def load_site(index: int, size: int, scale: float, seed: int) -> SiteSplits:
        calls.append((index, size, scale, seed))
        empty = SegArrays(np.zeros((0, 3, size, size), np.float32), np.zeros((0, 1, size, size), np.float32), ())
        return SiteSplits(names[index], empty, empty, empty)

    return DatasetInfo(names, ("gland",), load_site, preprocessing="percentile"), calls


def test_hold_out_removes_the_site_and_keeps_the_order_of_the_others():
    info, calls = recording_info(("s1", "s2", "s3", "s4"))

    kept = hold_out(info, "s2")

    assert kept.site_names == ("s1", "s3", "s4")
    assert kept.num_sites == 3
    assert kept.structures == ("gland",) and kept.preprocessing == "percentile"
    assert [kept.load_site(i, 32, 0.1, 7).name for i in range(3)] == ["s1", "s3", "s4"]
    assert calls == [(0, 32, 0.1, 7), (2, 32, 0.1, 7), (3, 32, 0.1, 7)]  # arguments passed through
    assert info.site_names == ("s1", "s2", "s3", "s4")  # the original is unchanged


def test_hold_out_of_the_last_site_and_twice_in_a_row():
    info, _ = recording_info(("s1", "s2", "s3", "s4"))

    last = hold_out(info, "s4")
    twice = hold_out(hold_out(info, "s1"), "s3")

    assert [last.load_site(i, 32, 1.0, 0).name for i in range(3)] == ["s1", "s2", "s3"]
    assert twice.site_names == ("s2", "s4")
    assert [twice.load_site(i, 32, 1.0, 0).name for i in range(2)] == ["s2", "s4"]


def test_an_empty_name_returns_the_same_info():
    info, _ = recording_info(("s1", "s2", "s3"))

    assert hold_out(info, "") is info


def test_an_unknown_site_is_a_value_error_listing_the_sites():
    info, _ = recording_info(("s1", "s2", "s3"))

    with pytest.raises(ValueError, match=r"'s9' is not a site of the dataset \['s1', 's2', 's3'\]"):
        hold_out(info, "s9")


def test_holding_out_a_site_of_two_leaves_too_few():
    info, _ = recording_info(("s1", "s2"))

    with pytest.raises(ValueError, match="would leave 1 site; FedSM needs two or more"):
        hold_out(info, "s1")


def test_synthetic_prostate_is_registered():
    assert "synthetic-prostate" in DATASETS
    info = dataset_info("synthetic-prostate")
    assert info.site_names == tuple(site.name for site in PROSTATE_SITES)
    assert info.structures == ("prostate",)


def test_training_dataset_loads_the_same_arrays_as_the_full_dataset():
    full = dataset_info("synthetic-prostate")

    kept = training_dataset("synthetic-prostate", "site-2")

    assert kept.site_names == ("site-1", "site-3", "site-4", "site-5", "site-6")
    for index, full_index in [(0, 0), (1, 2)]:  # site-1 and site-3 (a shifted index)
        got = kept.load_site(index, 32, 0.01, 0)
        expected = full.load_site(full_index, 32, 0.01, 0)
        assert got.name == expected.name == full.site_names[full_index]
        for split in ("train", "val", "test"):
            np.testing.assert_array_equal(getattr(got, split).images, getattr(expected, split).images)
            np.testing.assert_array_equal(getattr(got, split).masks, getattr(expected, split).masks)
            assert getattr(got, split).ids == getattr(expected, split).ids


def test_training_dataset_without_a_held_out_site_is_the_full_dataset():
    assert training_dataset("synthetic-fundus").site_names == dataset_info("synthetic-fundus").site_names
    with pytest.raises(ValueError, match="'site-9' is not a site"):
        training_dataset("synthetic-fundus", "site-9")


def test_held_out_site_round_trips_through_the_run_config():
    config = RunConfig(dataset="synthetic-prostate", held_out_site="site-3")

    mapping = config.to_mapping()

    assert mapping["held-out-site"] == "site-3"
    assert RunConfig.from_mapping(mapping) == config
    assert RunConfig().held_out_site == ""
    assert RunConfig.from_mapping({"held-out-site": "site-1"}).held_out_site == "site-1"
    with pytest.raises(TypeError, match="held-out-site"):
        RunConfig.from_mapping({"held-out-site": 3})


def test_a_federation_specs_short_name_is_its_file_stem_and_a_named_dataset_keeps_its_name():
    assert dataset_label("experiments/federations/drishti-six-site.toml") == "drishti-six-site"
    assert dataset_label("synthetic-fundus-style") == "synthetic-fundus-style"
