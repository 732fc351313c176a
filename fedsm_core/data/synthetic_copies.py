"""Variants of the generated fundus federation: any number of sites, or one annotation protocol.

**Style-only shift.** ``synthetic-fundus-style`` (:data:`STYLE_ONLY_DATASET`)
has the six sites of ``synthetic-fundus`` with the same images (every random
draw is kept) but one annotation protocol for all of them
(:data:`STYLE_ONLY_SITES`): the outlines follow the visible disc and cup
(``disc_margin = 0``, ``cup_scale = 1``, the mean protocol of the six sites),
with the same small per-image annotator noise. Sites then differ in
appearance only, so a method gains from personalization only as far as it
copes with the camera, not by learning a site's way of drawing outlines.

**Any size.**
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
from fedsm_core.data.synthetic_fundus import FUNDUS_SITES, SiteProfile, generate_site

PREFIX = "synthetic-fundus-"
MIN_SITES = 2
MAX_SITES = 60
# Repeats of a profile shift the base seed by this much (seeds below it never collide).
SEED_STRIDE = 1_000_003
STYLE_ONLY_DATASET = "synthetic-fundus-style"
STYLE_ONLY_MARGIN, STYLE_ONLY_CUP_SCALE = 0.0, 1.0  # outline = visible edge for every site
STYLE_ONLY_SITES: tuple[SiteProfile, ...] = tuple(
    dataclasses.replace(site, disc_margin=STYLE_ONLY_MARGIN, cup_scale=STYLE_ONLY_CUP_SCALE) for site in FUNDUS_SITES
)
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


def generate_style_only_site(site_index: int, image_size: int = 64, scale: float = 0.5,
                             seed: int = 0) -> SiteSplits:
    """Site ``site_index`` (0..5) of ``synthetic-fundus-style``: the images of ``synthetic-fundus``, one protocol.

    Parameters and result as :func:`fedsm_core.data.synthetic_fundus.generate_site`;
    only the masks differ from that site's.
    """
    return generate_site(site_index, image_size, scale, seed, profiles=STYLE_ONLY_SITES)
