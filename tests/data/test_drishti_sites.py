"""Tests of the real-image six-site Drishti-GS1 benchmark (fake roots, plus the real one when present)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedsm_core.data.drishti_sites import (
    DRISHTI_SITES,
    MIN_SITE_IMAGES,
    acquire,
    inspect_drishti_root,
    load_drishti_site,
    partition_sizes,
    partition_stems,
)
from fedsm_core.data.files import DataError
from fedsm_core.data.png_layouts import load_png_site
from fedsm_core.data.registry import dataset_info
from fedsm_core.data.synthetic_fundus import PAPER_SITE_SIZES

pytestmark = pytest.mark.long_module(seconds=25)

FAKE_TOTAL = 60
FAKE_SIDE = 96
SIZE = 32
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
REAL_ROOT = SHARED_DATA / "fundus-drishti-gs1-roi"


def _fake_example(rng: np.random.Generator, side: int) -> tuple[np.ndarray, np.ndarray, tuple]:
    """An orange textured retina with a bright yellow disc and a paler cup; DoFE mask values."""
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32)
    cx, cy = side * rng.uniform(0.4, 0.6, 2)
    radius = side * rng.uniform(0.14, 0.2)
    dist = np.hypot(xx - cx, yy - cy)
    base = np.array([150, 60, 20]) * rng.uniform(0.9, 1.1, 3)
    image = base + rng.normal(0.0, 6.0, (side, side, 3))
    image[dist <= radius] = [235, 200, 90]
    image[dist <= 0.5 * radius] = [250, 235, 170]
    mask = np.full((side, side), 255, np.uint8)
    mask[dist <= radius] = 128
    mask[dist <= 0.5 * radius] = 0
    return np.clip(image, 0, 255).astype(np.uint8), mask, (cx, cy, radius)


def _write_root(root: Path, total: int = FAKE_TOTAL, side: int = FAKE_SIDE) -> Path:
    rng = np.random.default_rng(123)
    for k in range(1, total + 1):
        split = "train" if k % 2 else "test"  # interleaved, like the official split
        image, mask, _ = _fake_example(rng, side)
        for kind, array in (("image", image), ("mask", mask)):
            folder = root / split / "ROIs" / kind
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(array).save(folder / f"drishtiGS_{k:03d}.png")
    return root


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory) -> Path:
    return _write_root(tmp_path_factory.mktemp("drishti") / "fundus-drishti-gs1-roi")


@pytest.fixture(scope="module")
def fake_sites(fake_root):
    return [load_drishti_site(fake_root, i, SIZE, seed=0) for i in range(len(DRISHTI_SITES))]


def _all(site, field):
    return np.concatenate([getattr(getattr(site, s), field) for s in ("train", "val", "test")])


def _stems(site) -> list[str]:
    return [i.split("/", 1)[1] for s in ("train", "val", "test") for i in getattr(site, s).ids]


def test_partition_sizes_follow_the_paper_with_a_floor():
    assert partition_sizes(101) == (8, 10, 8, 24, 9, 42)
    assert partition_sizes(905) == PAPER_SITE_SIZES
    assert partition_sizes(9050) == tuple(10 * n for n in PAPER_SITE_SIZES)
    for total in range(18, 1200, 7):
        sizes = partition_sizes(total)
        floor = min(MIN_SITE_IMAGES, total // 6)
        assert sum(sizes) == total and min(sizes) >= floor, (total, sizes)
        for i, j in itertools.permutations(range(6), 2):  # bigger paper site, no smaller here
            if PAPER_SITE_SIZES[i] > PAPER_SITE_SIZES[j]:
                assert sizes[i] >= sizes[j], (total, sizes)
        free = [i for i in range(6) if sizes[i] > floor]  # above the floor: proportional share
        rest = sum(sizes[i] for i in free)
        for i in free:
            share = rest * PAPER_SITE_SIZES[i] / sum(PAPER_SITE_SIZES[k] for k in free)
            assert abs(sizes[i] - share) < 1.0, (total, sizes)
    for bad in (17, 0, -5, 30.0, True, "60"):
        with pytest.raises(ValueError):
            partition_sizes(bad)


def test_partition_is_seeded_and_ignores_listing_order():
    stems = [f"drishtiGS_{k:03d}" for k in range(1, 102)]
    sites = partition_stems(stems, seed=0)
    shuffled = stems[:]
    random.Random(4).shuffle(shuffled)
    assert partition_stems(shuffled, seed=0) == sites
    assert partition_stems(stems, seed=1) != sites
    assert [len(s) for s in sites] == list(partition_sizes(101))
    assert sorted(itertools.chain(*sites)) == stems


def test_sites_are_disjoint_cover_every_image_and_split_50_25_25(fake_sites):
    stems = [_stems(site) for site in fake_sites]
    everything = list(itertools.chain(*stems))
    assert len(everything) == len(set(everything)) == FAKE_TOTAL
    assert set(everything) == {f"drishtiGS_{k:03d}" for k in range(1, FAKE_TOTAL + 1)}
    assert tuple(len(s) for s in stems) == partition_sizes(FAKE_TOTAL)
    for site, profile in zip(fake_sites, DRISHTI_SITES, strict=True):
        n = len(_stems(site))
        assert site.name == profile.name
        assert (len(site.train), len(site.val), len(site.test)) == (n - 2 * (n // 4), n // 4, n // 4)
        assert all(i.startswith(f"{profile.name}/") for i in site.train.ids + site.val.ids + site.test.ids)


def test_shapes_dtypes_and_binary_masks(fake_sites):
    for site in fake_sites:
        for split in (site.train, site.val, site.test):
            assert split.images.dtype == np.float32 and split.masks.dtype == np.float32
            assert split.images.shape == (len(split), 3, SIZE, SIZE)
            assert split.masks.shape == (len(split), 2, SIZE, SIZE)
            assert split.images.min() >= 0.0 and split.images.max() <= 1.0
            assert set(np.unique(split.masks).tolist()) == {0.0, 1.0}
            assert np.all(split.masks[:, 1] <= split.masks[:, 0])  # the cup lies inside the disc
            assert np.all(split.masks[:, 0].sum(axis=(1, 2)) > 0)
            assert not _touches_border(split.masks), site.name  # no mirrored copy of a disc


def _touches_border(masks: np.ndarray) -> bool:
    """Whether any disc reaches the image edge (where the crop mirrors the ROI)."""
    disc = masks[:, 0]
    return bool(disc[:, [0, -1]].any() or disc[:, :, [0, -1]].any())


def test_loading_is_deterministic_and_a_site_alone_equals_it_after_the_others(fake_root, fake_sites):
    alone = load_drishti_site(fake_root, 4, SIZE, seed=0)  # a fresh load of one site only
    after = fake_sites[4]  # loaded after sites 0..3 in the fixture
    for split in ("train", "val", "test"):
        a, b = getattr(alone, split), getattr(after, split)
        assert a.ids == b.ids
        np.testing.assert_array_equal(a.images, b.images)
        np.testing.assert_array_equal(a.masks, b.masks)
    other = load_drishti_site(fake_root, 4, SIZE, seed=1, name="renamed")
    assert other.train.ids[0].startswith("renamed/")
    assert set(_stems(other)) != set(_stems(alone))  # another data seed, another partition


def _colour(site) -> np.ndarray:
    return _all(site, "images").mean(axis=(2, 3))  # per-image mean colour [N, 3]


def test_acquisition_shifts_make_sites_differ(fake_sites):
    colours = {site.name: _colour(site) for site in fake_sites}
    means = {name: c.mean(axis=0) for name, c in colours.items()}
    # Two halves of one site differ only by per-image jitter and content.
    within = {name: np.linalg.norm(c[0::2].mean(axis=0) - c[1::2].mean(axis=0)) for name, c in colours.items()}
    for a, b in itertools.combinations(colours, 2):
        between = np.linalg.norm(means[a] - means[b])
        assert between > max(within[a], within[b]), (a, b, between, within[a], within[b])


def test_zoom_reaches_the_masks_and_the_masks_stay_on_the_bright_disc(fake_root, fake_sites):
    original = load_png_site(fake_root, "fundus-dofe", SIZE)
    base = np.concatenate([_all(original, "masks")[:, 0].mean(axis=(1, 2))]).mean()
    discs = {p.name: _all(s, "masks")[:, 0].mean(axis=(1, 2)).mean() for p, s in zip(DRISHTI_SITES, fake_sites,
                                                                                     strict=True)}
    assert discs["site-3"] > 1.15 * base  # tight crop: the disc looks larger
    assert discs["site-2"] < 0.8 * base  # wide field: the disc looks smaller
    for site in fake_sites:
        grey, discs_ = _all(site, "images").mean(axis=1), _all(site, "masks")[:, 0]
        for image, disc in zip(grey, discs_, strict=True):
            area = int(disc.sum())
            brightest = np.argsort(image.ravel())[-area:]  # as many pixels as the mask holds
            assert disc.ravel()[brightest].mean() > 0.8, site.name


def test_acquire_moves_image_and_mask_with_one_window():
    rng = np.random.default_rng(5)
    image, mask, (cx, cy, radius) = _fake_example(rng, 200)
    targets = np.stack([mask <= 128, mask == 0])
    plain = dataclasses.replace(DRISHTI_SITES[0], zoom=1.3, offset=0.12, jitter=0.0, jpeg=0)
    picture, labels = acquire(image, targets, plain, np.random.default_rng(9), 64)
    bright = picture.mean(axis=0) > 0.6
    disc = labels[0] > 0
    assert (bright & disc).sum() / (bright | disc).sum() > 0.85
    # The same disc without the window would be about 1.3x bigger and elsewhere.
    assert abs(disc.sum() / (math.pi * (radius * 64 / 200) ** 2) - 1 / 1.3**2) < 0.15
    # A non-square photograph: a square window centred on it, image and mask aligned.
    centred = dataclasses.replace(plain, offset=0.0)
    picture, labels = acquire(image[:, 15:185], targets[:, :, 15:185], centred, np.random.default_rng(9), 64)
    bright, disc = picture.mean(axis=0) > 0.6, labels[0] > 0
    assert picture.shape == (3, 64, 64) and (bright & disc).sum() / (bright | disc).sum() > 0.85
    crop = round(170 * 1.3)
    expected = (32 + (cy - 100) * 64 / crop, 32 + (cx - 15 - 85) * 64 / crop)
    centroid = [float((np.nonzero(disc)[k] + 0.5).mean()) for k in (0, 1)]
    assert np.allclose(centroid, expected, atol=1.5), (centroid, expected)


def test_missing_or_wrong_root_is_a_data_error(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match="nowhere.*ROIs"):
        load_drishti_site(missing, 0, SIZE)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"empty.*\{train,test\}/ROIs/\{image,mask\}"):
        load_drishti_site(empty, 0, SIZE)
    small = _write_root(tmp_path / "small", total=12, side=32)
    with pytest.raises(DataError, match="holds 12 image/mask pairs"):
        load_drishti_site(small, 0, SIZE)


def test_a_name_in_both_train_and_test_is_a_data_error(tmp_path):
    root = _write_root(tmp_path / "root", total=24, side=32)
    for kind in ("image", "mask"):
        source = root / "train" / "ROIs" / kind / "drishtiGS_001.png"
        (root / "test" / "ROIs" / kind / "drishtiGS_001.png").write_bytes(source.read_bytes())
    with pytest.raises(DataError, match="drishtiGS_001"):
        load_drishti_site(root, 0, SIZE)


@pytest.mark.parametrize("bad", [6, -1, True, 1.0, "0"])
def test_bad_site_index_is_a_value_error(fake_root, bad):
    with pytest.raises(ValueError, match="site_index"):
        load_drishti_site(fake_root, bad, SIZE)


def test_inspect_reuses_the_png_checks(fake_root, tmp_path):
    assert inspect_drishti_root(fake_root).ok
    assert not inspect_drishti_root(tmp_path / "nowhere").ok


def _real_root() -> Path:
    if not REAL_ROOT.is_dir():
        pytest.skip(f"real Drishti-GS1 ROIs not found at {REAL_ROOT} (research data kept outside the repo)")
    return REAL_ROOT


def test_real_sites_cover_all_101_images_with_non_empty_masks():
    root = _real_root()
    sites = [load_drishti_site(root, i, 64) for i in range(len(DRISHTI_SITES))]
    assert tuple(len(_stems(s)) for s in sites) == partition_sizes(101) == (8, 10, 8, 24, 9, 42)
    stems = list(itertools.chain(*(_stems(s) for s in sites)))
    assert len(stems) == len(set(stems)) == 101
    for site in sites:
        masks, grey = _all(site, "masks"), _all(site, "images").mean(axis=1)
        assert np.all(masks[:, 0].sum(axis=(1, 2)) > 0) and np.all(masks[:, 1].sum(axis=(1, 2)) > 0)
        assert not _touches_border(masks), site.name
        # The dark field-of-view border never hides the labelled disc.
        assert (grey[masks[:, 0] > 0] < 0.05).mean() < 0.01, site.name


def test_real_sites_move_toward_their_reference_sources():
    root = _real_root()
    samples = SHARED_DATA / "multisite-samples" / "Fundus"
    if not samples.is_dir():
        pytest.skip(f"real multi-site fundus samples not found at {samples}")
    native = _colour(load_drishti_site(root, 0, 64)).mean(axis=0)
    # site-2: REFUGE validation (Domain4), site-5: RIM-ONE (Domain2), site-6: REFUGE train (Domain3).
    for index, domain in ((1, "Domain4"), (4, "Domain2"), (5, "Domain3")):
        target = _colour(load_png_site(samples / domain, "fundus-dofe", 64)).mean(axis=0)
        shifted = _colour(load_drishti_site(root, index, 64)).mean(axis=0)
        assert np.linalg.norm(shifted - target) < 0.5 * np.linalg.norm(native - target), domain


def _test_set(load, seed: int) -> frozenset[str]:
    return frozenset(i for index in range(len(DRISHTI_SITES)) for i in load(index, seed).test.ids)


def test_three_data_seeds_give_three_different_test_sets(fake_root):
    # Execute
    sets = [_test_set(lambda index, seed: load_drishti_site(fake_root, index, SIZE, seed=seed), s) for s in (0, 1, 2)]

    # Assert: every pair of seeds tests on other images (the same number of them)
    assert len({len(s) for s in sets}) == 1
    assert all(a != b for a, b in itertools.combinations(sets, 2))


def test_the_federation_passes_data_seed_to_the_partition():
    # The run config's data-seed reaches the partition through the dataset registry (real data only).
    _real_root()
    spec = Path(__file__).resolve().parents[2] / "experiments" / "federations" / "drishti-six-site.toml"
    info = dataset_info(str(spec))
    sets = [_test_set(lambda index, seed: info.load_site(index, 32, 1.0, seed), s) for s in (0, 1, 2)]
    assert all(a != b for a, b in itertools.combinations(sets, 2))
    assert _test_set(lambda index, seed: info.load_site(index, 32, 1.0, seed), 1) == sets[1]
