"""Checks every generated dataset's site generator must pass (synthetic fundus, synthetic prostate).

Each generator module exposes ``generate_site(index, image_size, scale, seed)``,
``generate_sites(num_sites, image_size, scale, seed)`` and ``site_size(index, scale)``
with the same argument checks; its own test module calls these with its module.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

SPLITS = ("train", "val", "test")


def check_deterministic_and_seed_dependent(generator: ModuleType, scale: float) -> None:
    """The same seed gives the same site bit for bit (images, masks, ids); another seed another site."""
    a = generator.generate_site(2, image_size=48, scale=scale, seed=3)
    b = generator.generate_site(2, image_size=48, scale=scale, seed=3)
    c = generator.generate_site(2, image_size=48, scale=scale, seed=4)
    for split in SPLITS:
        assert np.array_equal(getattr(a, split).images, getattr(b, split).images), split
        assert np.array_equal(getattr(a, split).masks, getattr(b, split).masks), split
        assert getattr(a, split).ids == getattr(b, split).ids, split
    assert not np.array_equal(a.train.images, c.train.images)
    assert not np.array_equal(a.train.masks, c.train.masks)


def check_site_alone_matches_federation(generator: ModuleType, sites: list, size: int, scale: float) -> None:
    """A site generated on its own, or in a smaller federation, equals that site of the six-site federation."""
    alone = generator.generate_site(4, image_size=size, scale=scale, seed=0)
    assert np.array_equal(alone.test.images, sites[4].test.images)
    assert np.array_equal(alone.test.masks, sites[4].test.masks)
    first_two = generator.generate_sites(num_sites=2, image_size=size, scale=scale, seed=0)
    assert np.array_equal(first_two[1].train.images, sites[1].train.images)


# Arguments every generator refuses, with the name its error must carry.
BAD_ARGUMENTS = [
    ("generate_site", (-1,), {}, "site_index"),
    ("generate_site", (6,), {}, "site_index"),
    ("generate_site", (1.5,), {}, "site_index"),
    ("generate_site", (0,), {"image_size": 16}, "image_size"),
    ("generate_site", (0,), {"scale": 0.0}, "scale"),
    ("generate_site", (0,), {"scale": -1.0}, "scale"),
    ("generate_site", (0,), {"seed": -1}, "seed"),
    ("site_size", (7, 0.5), {}, "site_index"),
    ("site_size", (0, float("nan")), {}, "scale"),
    ("generate_sites", (), {"num_sites": 0}, "num_sites"),
    ("generate_sites", (), {"num_sites": 7}, "num_sites"),
]


def check_bad_argument(generator: ModuleType, function: str, args: tuple, kwargs: dict, name: str) -> None:
    """The call raises ``ValueError`` naming the bad argument."""
    with pytest.raises(ValueError, match=name):
        getattr(generator, function)(*args, **kwargs)


def check_error_names_value_and_range(generator: ModuleType) -> None:
    """The message says which argument, its allowed range and the value found."""
    with pytest.raises(ValueError, match=r"site_index must be an integer in 0\.\.5, got 9"):
        generator.generate_site(9)
    with pytest.raises(ValueError, match=r"image_size must be an integer >= 32, got 31"):
        generator.generate_site(0, image_size=31)
