"""Other partitions of the same training images: the rungs of the generalization-gap ladder.

Federated training can fall short of pooled training for three reasons that
these partitions take apart, each keeping every training image exactly once:

``one-site``
    Every training image at one site: the federated round protocol (a fresh
    optimizer each round, a fixed number of local epochs) without averaging.
``iid``
    The pooled training images dealt at random to as many sites as the real
    partition, of the real sizes: what averaging several sites costs when
    their data do not differ.
``real``
    The sites as they are: averaging plus the sites' heterogeneity.

Validation and test splits never change: every rung is scored on the real
sites' own held-out images, so the rungs differ in training only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fedsm_core.data.arrays import SegArrays, SiteSplits, merged_spacings

PARTITIONS = ("one-site", "iid", "real")
POOLED_SITE = "all-sites"


def take(data: SegArrays, indices: np.ndarray) -> SegArrays:
    """The images of ``data`` at ``indices``, in that order, with their masks and ids."""
    return SegArrays(data.images[indices], data.masks[indices], tuple(data.ids[i] for i in indices), data.spacings)


def pool_training(sites: Sequence[SiteSplits]) -> SegArrays:
    """Every site's training images in one split, site after site, ids unchanged."""
    if not sites:
        raise ValueError("pool_training: no sites")
    return SegArrays(np.concatenate([s.train.images for s in sites]), np.concatenate([s.train.masks for s in sites]),
                     tuple(i for s in sites for i in s.train.ids), merged_spacings([s.train for s in sites]))


def repartition(sites: Sequence[SiteSplits], partition: str, seed: int) -> list[SiteSplits]:
    """The training sites of ``partition`` (one of :data:`PARTITIONS`) built from ``sites``.

    Parameters
    ----------
    sites : sequence of SiteSplits
        The real sites.
    partition : str
        ``real`` returns ``sites``; ``one-site`` one site named
        :data:`POOLED_SITE` holding every training image (its validation and
        test splits pooled too, so it can be evaluated like any site);
        ``iid`` as many sites as ``sites``, each of its real training size,
        filled from one random permutation of the pooled images (``seed``).

    Returns
    -------
    list of SiteSplits
        The sites to train on. Their training images are, together, exactly the
        real sites' training images.
    """
    if partition not in PARTITIONS:
        raise ValueError(f"partition '{partition}' is not one of {list(PARTITIONS)}")
    if partition == "real":
        return list(sites)
    pooled = pool_training(sites)
    if partition == "one-site":
        val = SegArrays(np.concatenate([s.val.images for s in sites]), np.concatenate([s.val.masks for s in sites]),
                        tuple(i for s in sites for i in s.val.ids), merged_spacings([s.val for s in sites]))
        test = SegArrays(np.concatenate([s.test.images for s in sites]),
                         np.concatenate([s.test.masks for s in sites]), tuple(i for s in sites for i in s.test.ids),
                         merged_spacings([s.test for s in sites]))
        return [SiteSplits(POOLED_SITE, pooled, val, test)]
    order = np.random.default_rng(seed).permutation(len(pooled))
    ends = np.cumsum([len(s.train) for s in sites])
    return [dataclasses.replace(site, train=take(pooled, np.sort(order[end - len(site.train):end])))
            for site, end in zip(sites, ends, strict=True)]
