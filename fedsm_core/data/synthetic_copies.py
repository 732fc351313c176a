"""Synthetic fundus federations of any size: the six site profiles, repeated with other seeds.

``synthetic-fundus-<K>`` (``2 <= K <= 60``) names a federation of K generated
sites for scaling studies. Site ``i`` uses the acquisition and annotation
profile ``i mod 6`` of :data:`~fedsm_core.data.synthetic_fundus.FUNDUS_SITES`
and is called ``site-<i + 1>``; its images are drawn with the base seed
``seed + SEED_STRIDE * (i // 6)``, so repeats of a profile hold different
images. The first six sites are exactly those of ``synthetic-fundus``, so
``synthetic-fundus-2`` is its first two sites and ``synthetic-fundus-6`` is
``synthetic-fundus`` itself.
"""

from __future__ import annotations

import dataclasses
import re

from fedsm_core.data.arrays import SegArrays, SiteSplits
from fedsm_core.data.synthetic_fundus import FUNDUS_SITES, generate_site

PREFIX = "synthetic-fundus-"
MIN_SITES = 2
MAX_SITES = 60
# Repeats of a profile shift the base seed by this much (seeds below it never collide).
SEED_STRIDE = 1_000_003
_PATTERN = re.compile(re.escape(PREFIX) + r"(\d+)")


def fundus_site_count(dataset: str) -> int | None:
    """K of a ``synthetic-fundus-<K>`` dataset name; ``None`` for any other name.

    Raises
    ------
    ValueError
        When the name has that form but K is outside ``2..60``.
    """
    match = _PATTERN.fullmatch(dataset)
    if match is None:
        return None
    count = int(match.group(1))
    if not MIN_SITES <= count <= MAX_SITES:
        raise ValueError(f"dataset = '{dataset}': the number of sites must be in {MIN_SITES}..{MAX_SITES}, "
                         f"got {count}")
    return count


def copy_site_name(site_index: int) -> str:
    """``site-<i + 1>``: the name of site ``i`` (the same as ``synthetic-fundus`` for ``i < 6``)."""
    return f"site-{site_index + 1}"


def generate_copy_site(site_index: int, image_size: int = 64, scale: float = 0.5, seed: int = 0) -> SiteSplits:
    """Site ``site_index`` of a repeated synthetic fundus federation (see the module docstring).

    Parameters
    ----------
    site_index : int
        ``>= 0``; profile ``site_index % 6``, repeat ``site_index // 6``.
    image_size, scale, seed
        As :func:`fedsm_core.data.synthetic_fundus.generate_site`.

    Returns
    -------
    SiteSplits
        Named ``site-<site_index + 1>``, with image ids ``site-<site_index + 1>/NNNN``.
    """
    if isinstance(site_index, bool) or not isinstance(site_index, int) or site_index < 0:
        raise ValueError(f"site_index must be an integer >= 0, got {site_index!r}")
    repeat, profile = divmod(site_index, len(FUNDUS_SITES))
    site = generate_site(profile, image_size, scale, seed + SEED_STRIDE * repeat)
    if repeat == 0:
        return site
    name = copy_site_name(site_index)
    renamed = [_renamed(split, name) for split in (site.train, site.val, site.test)]
    return SiteSplits(name, *renamed)


def _renamed(split: SegArrays, name: str) -> SegArrays:
    ids = tuple(f"{name}/{image_id.partition('/')[2]}" for image_id in split.ids)
    return dataclasses.replace(split, ids=ids)
