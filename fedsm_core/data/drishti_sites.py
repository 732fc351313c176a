"""A six-site fundus benchmark made of real Drishti-GS1 images under simulated cameras.

The 101 Drishti-GS1 regions of interest (DoFE layout; the 50 train and 51 test
folder images are pooled) are partitioned into six **disjoint** sites whose
sizes follow the FedSM paper's site proportions (:data:`PAPER_SITE_SIZES`)
with a floor of :data:`MIN_SITE_IMAGES`: 101 images give sites of
``(8, 10, 8, 24, 9, 42)``, split train/val/test as 4/2/2, 6/2/2, 4/2/2,
12/6/6, 5/2/2 and 22/10/10. Each site applies its own *acquisition* (camera)
shift in code; labels are the real masks, moved only by the same crop as their
image (no label shift).

Profiles come from the four real sources of the DoFE Fundus set (six samples
each, normalised and resized to 128 px as every loader does). Drishti-GS:
G/R 0.43, B/R 0.07, no dark border, disc 18 % of the ROI. RIM-ONE r3: darker
mid-tones (mean R 0.48 vs 0.59), redder (G/R 0.37), black strips where the
photograph ends, disc 9 %. REFUGE train (Zeiss): yellow-green (G/R 0.58,
B/R 0.30), high contrast, a field-of-view edge covering 14 %, disc 11 %.
REFUGE validation (Canon): pale grey-yellow (G/R 0.68, B/R 0.47), the sharpest
(Laplacian/std 0.38 vs 0.22), disc 7 %, a thin field-of-view arc. ``site-1``
keeps the Drishti look, ``site-2`` imitates REFUGE-Canon, ``site-5`` RIM-ONE
and ``site-6`` (the largest, as REFUGE is in the paper) REFUGE-Zeiss. The
paper's RIGA sources have no samples here: ``site-3`` is an old compressed
camera (blur, noise, JPEG quality 30, tight crop) and ``site-4`` a vignetted,
washed-out one, both inside the measured colour range. Per-image
normalisation (:func:`~fedsm_core.data.preprocess.normalize_image`) removes
global exposure; the cues left are colour balance, gamma, clipping,
sharpness, noise, compression, the dark border and the disc's scale and place.

Sites that zoom out show the retina beyond the ROI as a mirror image of its
edge band (black would mimic an image edge, which the field-of-view border
already models); the window keeps disc pixels out of that band. Camera
effects run at twice the output size (at least 128 px), so a site loads in
well under a second at 64 px. A site's images and draws depend only on
``(seed, site, image name)`` and the root's file names: a client can load
its site alone.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.doctor_report import SiteReport
from fedsm_core.data.files import DataError, Pair
from fedsm_core.data.masks import mask_encoding
from fedsm_core.data.png_layouts import SPLITS, pair_split, png_layout, read_pair
from fedsm_core.data.preprocess import normalize_image, resize_image, resize_mask, stack_examples, to_channels_first
from fedsm_core.data.synthetic_fundus import PAPER_SITE_SIZES

__all__ = ["DRISHTI_SITES", "MIN_SITE_IMAGES", "AcquisitionProfile", "acquire", "inspect_drishti_root",
           "load_drishti_site", "partition_sizes", "partition_stems"]

MIN_SITE_IMAGES = 8  # smallest site: 4 train, 2 val, 2 test images
_LAYOUT = png_layout("fundus-dofe")
_MIN_WORK = 128  # camera effects run at 2x the output size, never below this
_EDGE = 0.02  # soft width of the field-of-view edge, in half image sides


@dataclass(frozen=True)
class AcquisitionProfile:
    """The simulated camera of one site; per-image draws jitter it.

    Lengths are relative: ``blur`` in image sides, ``zoom`` and ``offset`` in
    ROI sides, ``fov_*`` in half image sides. ``noise`` is the std at the
    output resolution, on a [0, 1] scale.
    """

    name: str
    reference: str  # the real source the profile imitates, in words
    gain: tuple[float, float, float]  # per-channel (R, G, B) white balance and exposure
    gamma: float  # exponent on [0, 1]; > 1 darkens mid-tones
    contrast: float  # stretch around the image mean, then clipped to [0, 1]
    blur: float  # Gaussian sigma of the optics
    sharpen: float  # unsharp-mask amount of the camera's processing (0 = none)
    noise: float  # additive Gaussian sensor noise
    jpeg: int  # JPEG quality 1..95, 0 = no compression
    zoom: float  # crop side / ROI side; > 1 shows more retina (mirrored beyond the ROI)
    offset: float  # largest shift of the crop centre (disc off-centre)
    fov_radius: float  # radius of the dark circular field of view; 0 = none
    fov_shift: float  # distance of the field-of-view centre from the image centre
    jitter: float  # log-std of per-image gain, gamma and zoom changes


DRISHTI_SITES: tuple[AcquisitionProfile, ...] = (
    AcquisitionProfile("site-1", "Drishti-GS as released", gain=(1.0, 1.0, 1.0), gamma=1.0,
                       contrast=1.0, blur=0.0, sharpen=0.0, noise=0.0, jpeg=95, zoom=1.0, offset=0.02,
                       fov_radius=0.0, fov_shift=0.0, jitter=0.03),
    AcquisitionProfile("site-2", "REFUGE validation (Canon): pale, grey-yellow, sharp, wide field",
                       gain=(1.0, 1.35, 2.8), gamma=0.65, contrast=1.0, blur=0.0, sharpen=0.8, noise=0.004,
                       jpeg=90, zoom=1.4, offset=0.05, fov_radius=1.45, fov_shift=0.45, jitter=0.05),
    AcquisitionProfile("site-3", "old compressed camera: cool, blurred, noisy, tight crop",
                       gain=(0.95, 1.2, 2.0), gamma=1.1, contrast=1.0, blur=0.006, sharpen=0.0, noise=0.015,
                       jpeg=30, zoom=0.85, offset=0.06, fov_radius=0.0, fov_shift=0.0, jitter=0.08),
    AcquisitionProfile("site-4", "vignetted, washed-out camera: dark corners, low contrast",
                       gain=(1.05, 1.1, 1.4), gamma=0.8, contrast=0.8, blur=0.003, sharpen=0.0, noise=0.008,
                       jpeg=70, zoom=1.15, offset=0.04, fov_radius=1.1, fov_shift=0.1, jitter=0.06),
    AcquisitionProfile("site-5", "RIM-ONE r3: dark mid-tones, red, variable exposure, black strip",
                       gain=(1.0, 0.82, 0.95), gamma=1.35, contrast=1.0, blur=0.003, sharpen=0.0, noise=0.004,
                       jpeg=85, zoom=1.35, offset=0.08, fov_radius=2.2, fov_shift=1.3, jitter=0.12),
    AcquisitionProfile("site-6", "REFUGE train (Zeiss): yellow-green, high contrast, field-of-view edge",
                       gain=(0.9, 1.25, 2.5), gamma=1.2, contrast=1.15, blur=0.004, sharpen=0.0, noise=0.004,
                       jpeg=90, zoom=1.25, offset=0.05, fov_radius=1.35, fov_shift=0.55, jitter=0.06),
)


def partition_sizes(total: int, minimum: int = MIN_SITE_IMAGES) -> tuple[int, ...]:
    """Site sizes for ``total`` images: paper proportions with a floor.

    Sites whose proportional share falls below ``min(minimum, total // 6)``
    get that floor; the rest is shared among the others in proportion to
    :data:`PAPER_SITE_SIZES` (largest remainder rounding, ties to the lower
    index). ``partition_sizes(905) == PAPER_SITE_SIZES``.

    Raises
    ------
    ValueError
        If ``total`` cannot give every site one train, val and test image.
    """
    count = len(PAPER_SITE_SIZES)
    if isinstance(total, bool) or not isinstance(total, int) or total < 3 * count:
        raise ValueError(f"total = {total!r} must be an integer >= {3 * count} (3 images per site)")
    floor = min(minimum, total // count)
    fixed: set[int] = set()
    while True:  # a site raised to the floor shrinks the others' shares: repeat
        free = [i for i in range(count) if i not in fixed]
        remaining = total - floor * len(fixed)
        weight = sum(PAPER_SITE_SIZES[i] for i in free)
        shares = {i: remaining * PAPER_SITE_SIZES[i] / weight for i in free}
        low = {i for i in free if shares[i] < floor}
        if not low:
            break
        fixed |= low
    sizes = {i: floor for i in fixed} | {i: math.floor(s) for i, s in shares.items()}
    by_remainder = sorted(free, key=lambda i: (-(shares[i] - sizes[i]), i))
    for i in by_remainder[: total - sum(sizes.values())]:
        sizes[i] += 1
    return tuple(sizes[i] for i in range(count))


def _check_seed(seed: object) -> int:
    """``seed`` as int, or ValueError unless it is an integer >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def partition_stems(stems: list[str], seed: int = 0) -> list[list[str]]:
    """Split image names into the six disjoint sites (each list sorted).

    The names are sorted first, so listing order never matters; the shuffle
    depends only on ``seed``.
    """
    ordered = sorted(stems)
    order = np.random.default_rng([_check_seed(seed), *b"drishti-partition"]).permutation(len(ordered))
    bounds = np.cumsum((0, *partition_sizes(len(ordered))))
    return [sorted(ordered[k] for k in order[a:b]) for a, b in pairwise(bounds)]


def _split_site(stems: list[str], seed: int, index: int) -> tuple[list[str], list[str], list[str]]:
    """Train/val/test names of one site: 50/25/25 (val and test get ``n // 4``, at least 1)."""
    rng = np.random.default_rng([seed, index, *b"drishti-split"])
    shuffled = [stems[k] for k in rng.permutation(len(stems))]
    held = max(1, len(stems) // 4)
    return sorted(shuffled[2 * held:]), sorted(shuffled[held:2 * held]), sorted(shuffled[:held])


def _root_pairs(root: Path) -> dict[str, Pair]:
    """Every image/mask pair of the root's train and test folders, by name."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"Drishti-GS1 root {root} does not exist; expected the DoFE fundus layout "
                        "<root>/{train,test}/ROIs/{image,mask}/drishtiGS_NNN.png")
    pairs: dict[str, Pair] = {}
    for split in SPLITS:
        for pair in pair_split(root, _LAYOUT, split).pairs:
            if pair.stem in pairs:
                raise DataError(f"{pair.image} and {pairs[pair.stem].image} share the name '{pair.stem}'; "
                                "the sites pool train and test, so names must be unique")
            pairs[pair.stem] = pair
    if len(pairs) < 3 * len(DRISHTI_SITES):
        raise DataError(f"Drishti-GS1 root {root} holds {len(pairs)} image/mask pairs; six sites need "
                        f"at least {3 * len(DRISHTI_SITES)} (expected 101 in {_LAYOUT.expected()})")
    return pairs


def _crop_square(array: np.ndarray, top: int, left: int, side: int, row_axis: int) -> np.ndarray:
    """A ``side``-square window; beyond the array it mirrors (reflect) the edge."""
    height, width = array.shape[row_axis], array.shape[row_axis + 1]
    pad = max(0, -top, -left, top + side - height, left + side - width)
    if pad:
        widths = [(0, 0)] * array.ndim
        widths[row_axis] = widths[row_axis + 1] = (pad, pad)
        array = np.pad(array, widths, mode="reflect")
    index = [slice(None)] * array.ndim
    index[row_axis] = slice(top + pad, top + pad + side)
    index[row_axis + 1] = slice(left + pad, left + pad + side)
    return array[tuple(index)]


def _draw(profile: AcquisitionProfile, rng: np.random.Generator) -> dict:
    """Per-image camera parameters around the profile's values."""
    angle = math.pi * int(rng.integers(2)) + rng.normal(0.0, 0.3)  # FOV edge mostly left or right
    return {
        "gain": np.asarray(profile.gain) * np.exp(rng.normal(0.0, profile.jitter, 3)),
        "gamma": profile.gamma * math.exp(rng.normal(0.0, profile.jitter)),
        "zoom": profile.zoom * math.exp(rng.normal(0.0, profile.jitter / 2)),
        "offset": rng.uniform(-profile.offset, profile.offset, 2),
        "fov_centre": profile.fov_shift * np.array([math.cos(angle), math.sin(angle)]),
        "jpeg": int(np.clip(profile.jpeg + rng.integers(-5, 6), 5, 95)) if profile.jpeg else 0,
        "noise_seed": int(rng.integers(2**31)),
    }


def _window(shape: tuple[int, int], p: dict, disc: np.ndarray) -> tuple[int, int, int]:
    """``(top, left, crop)`` of the square crop window, kept off any mirrored disc.

    Beyond the ROI the crop mirrors the ROI's edge band; the window is shrunk
    or shifted so that band never reaches the disc (a mirrored second disc
    would be labelled, but it is not anatomy).
    """
    wanted = max(8, round(min(shape) * p["zoom"]))
    limits = []
    for axis, side, shift in ((1, shape[0], p["offset"][1]), (0, shape[1], p["offset"][0])):  # rows, columns
        hits = np.flatnonzero(disc.any(axis=axis))
        first, last = (int(hits[0]), int(hits[-1])) if hits.size else (side - 1, 0)
        low, high = -max(0, first - 1), side + max(0, side - 2 - last)
        limits.append((round(side * (0.5 + shift) - wanted / 2), low, high))
    crop = min(wanted, *(high - low for _, low, high in limits))
    top, left = (int(np.clip(start + (wanted - crop) // 2, low, high - crop)) for start, low, high in limits)
    return top, left, crop


def _geometry(image: np.ndarray, targets: np.ndarray, p: dict) -> tuple[np.ndarray, np.ndarray]:
    """Crop image ``[H, W, 3]`` and targets ``[K, H, W]`` with the same window (zoom and offset)."""
    top, left, crop = _window(image.shape[:2], p, targets[0])
    return _crop_square(image, top, left, crop, 0), _crop_square(targets, top, left, crop, 1)


def _fov(work: int, profile: AcquisitionProfile, centre: np.ndarray) -> np.ndarray:
    """Soft field-of-view mask ``[work, work, 1]``: 1 inside the circle, 0 outside."""
    if profile.fov_radius <= 0:
        return np.ones((work, work, 1), np.float32)
    coords = (np.arange(work, dtype=np.float32) + 0.5) * (2.0 / work) - 1.0
    dist = np.hypot(coords[None, :] - centre[0], coords[:, None] - centre[1])
    return np.clip((profile.fov_radius - dist) / _EDGE + 0.5, 0.0, 1.0)[..., None].astype(np.float32)


def _camera(picture: np.ndarray, profile: AcquisitionProfile, p: dict, size: int) -> np.ndarray:
    """Apply optics, sensor, tone curve, field of view and JPEG to ``uint8 [W, W, 3]``."""
    work = picture.shape[0]
    if profile.blur > 0:  # optics blur first: it acts on the scene, not on the noise
        picture = np.asarray(Image.fromarray(picture).filter(ImageFilter.GaussianBlur(profile.blur * work)))
    if profile.sharpen > 0:  # in-camera sharpening: crisper vessel edges
        unsharp = ImageFilter.UnsharpMask(radius=max(1.0, work / 128), percent=round(100 * profile.sharpen),
                                          threshold=0)
        picture = np.asarray(Image.fromarray(picture).filter(unsharp))
    x = picture.astype(np.float32) / 255.0 * p["gain"].astype(np.float32)
    # Box-averaging down to the output divides white noise by work/size.
    noise_rng = np.random.default_rng(p["noise_seed"])
    x += profile.noise * (work / size) * noise_rng.standard_normal(x.shape, dtype=np.float32)
    x = np.clip(x, 0.0, 1.0) ** np.float32(p["gamma"])
    mean = x.mean()
    x = np.clip(mean + np.float32(profile.contrast) * (x - mean), 0.0, 1.0)
    x *= _fov(work, profile, p["fov_centre"])
    out = np.round(x * 255.0).astype(np.uint8)
    if p["jpeg"]:
        buffer = io.BytesIO()
        Image.fromarray(out).save(buffer, format="JPEG", quality=p["jpeg"])
        out = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
    return out


def acquire(image: np.ndarray, targets: np.ndarray, profile: AcquisitionProfile,
            rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One real example seen through a site's camera, ready for a model.

    Returns
    -------
    tuple of np.ndarray
        Image float32 ``[3, S, S]`` in [0, 1] (per-image normalised) and
        targets float32 ``[K, S, S]`` in {0, 1}, cropped with the same window.
    """
    params = _draw(profile, rng)
    picture, labels = _geometry(image, targets, params)
    work = max(_MIN_WORK, 2 * size)
    resized = np.clip(np.round(resize_image(picture, work)), 0, 255).astype(np.uint8)
    shot = _camera(resized, profile, params, size).astype(np.float32)
    ready = to_channels_first(normalize_image(resize_image(shot, size)))
    return ready.astype(np.float32), resize_mask(labels, size).astype(np.float32)


def _check_index(site_index: object) -> int:
    """``site_index`` as int, or ValueError unless it indexes :data:`DRISHTI_SITES`."""
    if isinstance(site_index, bool) or not isinstance(site_index, (int, np.integer)) \
            or not 0 <= site_index < len(DRISHTI_SITES):
        raise ValueError(f"site_index must be an integer in 0..{len(DRISHTI_SITES) - 1}, got {site_index!r}")
    return int(site_index)


def load_drishti_site(root: Path, site_index: int, image_size: int, seed: int = 0,
                      name: str | None = None) -> SiteSplits:
    """Load one of the six sites as train/val/test arrays.

    Parameters
    ----------
    root : Path
        The ``fundus-drishti-gs1-roi`` folder (DoFE layout, masks 0 = cup,
        128 = rim, 255 = background).
    site_index : int
        0..5, index into :data:`DRISHTI_SITES`.
    image_size : int
        Side of the square output arrays (>= 8).
    seed : int
        Data seed: the partition, the split and every per-image draw.
    name : str, optional
        Site name for ids; the profile's name when omitted.

    Raises
    ------
    DataError
        If the root is missing, not in the DoFE layout, or its files are bad.
    ValueError
        For a bad ``site_index``, ``image_size`` or ``seed``.
    """
    index, seed = _check_index(site_index), _check_seed(seed)
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < 8:
        raise ValueError(f"image_size must be an integer >= 8, got {image_size!r}")
    profile, pairs = DRISHTI_SITES[index], _root_pairs(Path(root))
    site = name or profile.name
    decoder = mask_encoding(_LAYOUT.encoding)
    splits = []
    for stems in _split_site(partition_stems(list(pairs), seed)[index], seed, index):
        examples = [acquire(*read_pair(pairs[s], _LAYOUT, decoder), profile,
                            np.random.default_rng([seed, index, *s.encode()]), int(image_size)) for s in stems]
        splits.append(stack_examples(examples, [f"{site}/{s}" for s in stems],
                                     len(decoder.structures), int(image_size)))
    return SiteSplits(site, *splits)


def inspect_drishti_root(root: Path) -> SiteReport:
    """The data doctor's PNG-layout checks of the root (never raises for data problems)."""
    from fedsm_core.data.doctor import inspect_png_site  # the doctor imports more than loading needs

    return inspect_png_site(Path(root), _LAYOUT.name, name="drishti-gs1")
