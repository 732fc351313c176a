"""The ladder's partitions keep every training image exactly once and leave the held-out splits alone."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.data.arrays import SegArrays, SiteSplits
from fedsm_core.data.repartition import POOLED_SITE, repartition


def _split(site: str, split: str, count: int, value: float) -> SegArrays:
    images = np.full((count, 1, 2, 2), value, dtype=np.float32)
    return SegArrays(images, np.zeros((count, 1, 2, 2), np.float32), tuple(f"{site}/{split}{i}" for i in range(count)))


def _sites() -> list[SiteSplits]:
    sizes = [2, 5, 3]
    return [SiteSplits(f"site-{k}", _split(f"site-{k}", "train", n, k), _split(f"site-{k}", "val", 1, k),
                       _split(f"site-{k}", "test", 2, k)) for k, n in enumerate(sizes)]


def test_real_is_the_sites_as_they_are():
    sites = _sites()
    assert repartition(sites, "real", 0) == sites


def test_one_site_holds_every_training_image_and_every_held_out_image():
    sites = _sites()

    (pooled,) = repartition(sites, "one-site", 0)

    assert pooled.name == POOLED_SITE
    assert pooled.train.ids == tuple(i for s in sites for i in s.train.ids)
    assert len(pooled.val) == 3 and len(pooled.test) == 6
    np.testing.assert_array_equal(pooled.train.images[:, 0, 0, 0], [0, 0, 1, 1, 1, 1, 1, 2, 2, 2])


def test_iid_deals_the_pooled_images_to_sites_of_the_real_sizes():
    sites = _sites()

    dealt = repartition(sites, "iid", seed=3)

    assert [len(s.train) for s in dealt] == [2, 5, 3]
    assert sorted(i for s in dealt for i in s.train.ids) == sorted(i for s in sites for i in s.train.ids)
    for site, real in zip(dealt, sites, strict=True):  # held-out splits untouched, images follow their ids
        assert site.name == real.name and site.val is real.val and site.test is real.test
        np.testing.assert_array_equal(site.train.images[:, 0, 0, 0], [int(i[5]) for i in site.train.ids])
    assert any(set(d.train.ids) != set(r.train.ids) for d, r in zip(dealt, sites, strict=True))  # really mixed
    assert [s.train.ids for s in repartition(sites, "iid", seed=3)] == [s.train.ids for s in dealt]


def test_an_unknown_partition_is_named():
    with pytest.raises(ValueError, match="partition 'shuffled' is not one of"):
        repartition(_sites(), "shuffled", 0)
