"""Deterministic six-site synthetic fundus dataset (optic disc and optic cup).

The embedded default data of the project (no download). Each image is a
disc-centred RGB region of interest of a retina: orange-red textured background,
dark vessels branching out of the disc, a yellowish disc and a paler cup inside
it. Masks have two binary channels: 0 = disc (contains the cup), 1 = cup.

The six sites imitate the multi-source fundus collections used by FedSM
(Drishti-GS, the three RIGA sources, RIM-ONE, REFUGE) and differ in

* acquisition: colour cast, brightness, gamma, contrast, blur, noise, field of
  view (dark corners), disc position and size;
* annotation protocol: the disc outline is drawn with a site-specific margin
  around the visible disc and the cup outline is a site-specific fraction of
  the visible pale cup. One shared model that ignores the site cannot fit this
  label shift, which is what makes personalisation pay.

Site ``i`` draws from ``np.random.default_rng([seed, i])`` alone, so a client
can generate its own site without the others.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from fedsm_core.data.arrays import SegArrays, SiteSplits

__all__ = ["FUNDUS_SITES", "PAPER_SITE_SIZES", "SegArrays", "SiteProfile", "SiteSplits",
           "generate_site", "generate_sites", "site_size"]

PAPER_SITE_SIZES: tuple[int, ...] = (50, 98, 47, 230, 80, 400)

# Pixel-sized parameters are given for 64 px and rescaled: same look at any size.
_REFERENCE_SIZE = 64
# Float32 elements of one [B, H, W] plane per rendering chunk: bounds memory at
# 256 px while keeping numpy calls large at 64 px.
_CHUNK_ELEMENTS = 1 << 20

_BACKGROUND_RGB = np.array([0.80, 0.36, 0.17], dtype=np.float32)
_RIM_RGB = np.array([0.98, 0.78, 0.50], dtype=np.float32)
_CUP_RGB = np.array([1.00, 0.94, 0.80], dtype=np.float32)
# Blood absorbs green and blue much more than red, hence dark red vessels.
_VESSEL_ABSORPTION = np.array([0.45, 0.75, 0.75], dtype=np.float32)
_TWO_PI = np.float32(2.0 * np.pi)


@dataclass(frozen=True)
class SiteProfile:
    """Acquisition and annotation protocol of one synthetic site.

    Lengths are normalised (image half-width = 1), pixel sizes for 64 px;
    ranges are ``(low, high)`` of a per-image uniform draw.
    """

    name: str  # "site-1" .. "site-6"
    channel_gain: tuple[float, float, float]  # per-channel (R, G, B) colour cast
    brightness: float  # global exposure gain
    gamma: float  # exponent on the [0, 1] image; > 1 darkens mid-tones
    contrast: float  # stretch around the per-image channel mean
    blur_sigma: float  # Gaussian blur sigma, pixels at 64 px
    noise_std: float  # additive Gaussian noise
    fov_radius: float  # circular field of view; below ~1.4 the corners go dark
    disc_jitter: float  # std of the disc centre offset
    disc_radius: tuple[float, float]  # visible disc radius range
    cup_ratio: tuple[float, float]  # visible cup radius / disc radius range
    disc_margin: float  # annotated disc radius = visible * (1 + disc_margin)
    cup_scale: float  # annotated cup radius = visible cup radius * cup_scale


FUNDUS_SITES: tuple[SiteProfile, ...] = (
    # Drishti-GS-like: sharp, bright and warm; generous disc and cup outlines.
    SiteProfile("site-1", (1.08, 0.98, 0.80), 1.05, 0.95, 1.15, 0.3, 0.015, 1.60,
                0.04, (0.34, 0.44), (0.45, 0.70), 0.12, 1.20),
    # RIGA BinRushed-like: old camera, dark, red, blurred, vignetted; tight outlines.
    SiteProfile("site-2", (1.10, 0.78, 0.68), 0.90, 1.15, 0.95, 1.3, 0.020, 1.05,
                0.10, (0.28, 0.38), (0.35, 0.60), -0.15, 0.80),
    # RIGA Magrabia-like: cool greenish cast, bright, noisy; wide disc outline.
    SiteProfile("site-3", (0.88, 1.05, 1.10), 1.10, 0.85, 1.05, 0.6, 0.050, 1.30,
                0.06, (0.30, 0.40), (0.35, 0.60), 0.20, 1.00),
    # RIGA MESSIDOR-like: wider crops (small discs), low contrast, large cups.
    SiteProfile("site-4", (1.00, 1.00, 0.95), 0.95, 1.10, 0.75, 0.8, 0.030, 1.20,
                0.14, (0.20, 0.28), (0.30, 0.55), 0.00, 1.25),
    # RIM-ONE-like: tight crops (large discs), washed out, heavy blur.
    SiteProfile("site-5", (1.05, 0.92, 0.95), 1.00, 0.75, 0.80, 1.8, 0.020, 1.50,
                0.05, (0.40, 0.52), (0.35, 0.65), -0.08, 0.90),
    # REFUGE-like (Zeiss Visucam): dark brownish orange, sharp, noisy; mostly
    # healthy eyes with small annotated cups.
    SiteProfile("site-6", (0.95, 0.85, 0.60), 0.75, 1.15, 1.25, 0.2, 0.035, 1.15,
                0.08, (0.24, 0.34), (0.30, 0.50), 0.05, 0.85),
)


def _check_int(name: str, value: object, low: int, high: int | None) -> int:
    """Return ``value`` as int or raise ValueError naming the argument and range."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        valid = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {valid}, got {value!r}")
    return int(value)


def _check_scale(scale: object) -> float:
    """Return ``scale`` as float or raise ValueError unless it is finite and > 0."""
    ok = isinstance(scale, numbers.Real) and not isinstance(scale, bool)
    if not ok or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    return float(scale)


def site_size(site_index: int, scale: float) -> int:
    """Number of images of a site: ``max(8, round(PAPER_SITE_SIZES[i] * scale))``."""
    index = _check_int("site_index", site_index, 0, len(FUNDUS_SITES) - 1)
    return max(8, round(PAPER_SITE_SIZES[index] * _check_scale(scale)))


def _draw_vessels(rng: np.random.Generator, side: np.ndarray, start: np.ndarray) -> dict:
    """Draw 10 vessel curves per image: 4 arcades, 4 branches, 2 small vessels.

    A curve follows ``theta(rho) = a + c*rho + disp(rho)/rho`` in polar
    coordinates around the disc centre, where ``disp`` (arc length) makes
    branches diverge from their parent after ``rs`` and adds tortuosity.
    """
    n = side.shape[0]
    # Right eye (temporal = +x): arcades leave the disc near vertical
    # (-pi/2 + 0.35, -pi/2 - 0.55, ...) and bend temporally.
    a_main = np.array([-1.22, -2.12, 1.22, 2.12]) + rng.normal(0.0, 0.12, (n, 4))
    bend = rng.uniform(0.3, 0.6, (n, 1)) * np.array([1.0, -0.5, -1.0, 0.5])
    a_small = np.array([0.0, np.pi]) + rng.normal(0.0, 0.4, (n, 2))
    a = np.concatenate([a_main, a_main, a_small], axis=1)
    c = np.concatenate([bend, bend, rng.normal(0.0, 0.3, (n, 2))], axis=1)
    beta = np.zeros((n, 10))
    beta[:, 4:8] = rng.choice([-1.0, 1.0], (n, 4)) * rng.uniform(0.35, 0.7, (n, 4))
    rs = np.repeat(start[:, None], 10, axis=1)
    rs[:, 4:8] = rng.uniform(0.35, 0.75, (n, 4))  # where branches leave their arcade
    # Left eyes are mirror images: theta -> pi - theta flips every bend.
    mirror = side[:, None] < 0
    a = np.where(mirror, np.pi - a, a)
    c, beta = np.where(mirror, -c, c), np.where(mirror, -beta, beta)
    width = np.array([0.034] * 4 + [0.024] * 4 + [0.018] * 2) * rng.uniform(0.85, 1.15, (n, 10))
    return {"a": a, "c": c, "beta": beta, "rs": rs, "w0": width,
            "amp": rng.uniform(0.0, 0.035, (n, 10)), "freq": rng.uniform(4.0, 9.0, (n, 10))}


def _draw_params(rng: np.random.Generator, site: SiteProfile, n: int) -> dict:
    """Draw every per-image scene parameter of a site, each of leading size ``n``."""
    radius = rng.uniform(*site.disc_radius, n)
    side = rng.choice([-1.0, 1.0], n)  # eye laterality: where temporal is
    cup_ratio = rng.uniform(*site.cup_ratio, n)
    p = {
        "cx": np.clip(rng.normal(0.0, site.disc_jitter, n), -0.3, 0.3),
        "cy": np.clip(rng.normal(0.0, site.disc_jitter, n), -0.3, 0.3),
        "radius": radius, "side": side, "cup_ratio": cup_ratio,
        "aspect": rng.uniform(0.88, 1.0, n),  # discs are slightly taller than wide
        "tilt": rng.normal(0.0, 0.15, n),
        "cup_aspect": rng.uniform(0.82, 0.97, n),
        "cup_shift": side * rng.uniform(0.0, 0.15, n) * radius,  # cups sit temporally
        "illum": rng.normal(1.0, 0.06, n),
        # Per-image exposure and white balance blur the line between sites.
        "gain": rng.normal(1.0, 0.07, (n, 3)), "gamma": np.exp(rng.normal(0.0, 0.12, n)),
        "wave_freq": rng.uniform(1.0, 4.0, (n, 4)) * np.pi,
        "wave_dir": rng.uniform(0.0, 2.0 * np.pi, (n, 4)),
        "wave_phase": rng.uniform(0.0, 2.0 * np.pi, (n, 4)),
        "margin": site.disc_margin + rng.normal(0.0, 0.02, n),  # annotators vary a bit too
        "cup_scale": site.cup_scale * (1.0 + rng.normal(0.0, 0.03, n)),
    }
    p = {k: v.astype(np.float32) for k, v in p.items()}
    vessels = _draw_vessels(rng, side, 0.25 * cup_ratio * radius)
    p["vessels"] = {k: v.astype(np.float32) for k, v in vessels.items()}
    return p


def _col(values: np.ndarray) -> np.ndarray:
    """Per-image values ``[B]`` as float32 ``[B, 1, 1]`` to broadcast on planes."""
    return np.asarray(values, dtype=np.float32)[:, None, None]


def _ellipse_radius(dx: np.ndarray, dy: np.ndarray, ax: np.ndarray, ay: np.ndarray,
                    tilt: np.ndarray) -> np.ndarray:
    """Normalised elliptic radius (1 on the ellipse) of a tilted ellipse."""
    cos, sin = np.cos(tilt), np.sin(tilt)
    u = (dx * cos + dy * sin) / ax
    v = (dy * cos - dx * sin) / ay
    return np.sqrt(u * u + v * v)


def _vessel_map(rho: np.ndarray, theta: np.ndarray, ves: dict) -> np.ndarray:
    """Vessel opacity in [0, 1] of every pixel, ``[B, H, W]``."""
    vmap = np.zeros_like(rho)
    taper = np.clip(1.15 - 0.4 * rho, 0.55, None)  # vessels thin out away from the disc
    for k in range(ves["a"].shape[1]):
        a, c, beta, rs, w0, amp, freq = (_col(ves[key][:, k]) for key in
                                         ("a", "c", "beta", "rs", "w0", "amp", "freq"))
        t = np.maximum(rho - rs, 0.0)
        disp = beta * t + amp * np.sin(freq * t)
        centre = a + c * rho + disp / np.maximum(rho, 1e-3)
        delta = theta - centre
        delta -= _TWO_PI * np.round(delta * (1.0 / _TWO_PI))  # wrap; np.mod is 20x slower
        dist = rho * delta / (w0 * taper)
        # The ramp fades a vessel in where it starts instead of a hard end.
        np.maximum(vmap, np.exp(-dist * dist) * np.minimum(t * 20.0, 1.0), out=vmap)
    return vmap


def _texture(coords: np.ndarray, p: dict) -> np.ndarray:
    """Choroidal texture ``1 + 0.05 * sum_k cos(f_k (x cos a_k + y sin a_k) + phi_k)``.

    Plane waves factorise into 1-D cos/sin of x and y: one small batched matmul.
    """
    fx = (p["wave_freq"] * np.cos(p["wave_dir"]))[:, :, None] * coords
    fy = (p["wave_freq"] * np.sin(p["wave_dir"]))[:, :, None] * coords
    fx = fx + p["wave_phase"][:, :, None]
    rows = np.concatenate([np.cos(fy), -np.sin(fy)], axis=1).transpose(0, 2, 1)
    cols = np.concatenate([np.cos(fx), np.sin(fx)], axis=1)
    return 1.0 + 0.05 * (rows @ cols)


def _disc_geometry(dx: np.ndarray, dy: np.ndarray, p: dict) -> tuple[np.ndarray, np.ndarray]:
    """Elliptic radii (1 on the visible edge) of the disc and of the cup."""
    r, aspect, tilt = _col(p["radius"]), _col(p["aspect"]), _col(p["tilt"])
    d_disc = _ellipse_radius(dx, dy, r * aspect, r / aspect, tilt)
    cup_r, cup_aspect = r * _col(p["cup_ratio"]), _col(p["cup_aspect"])
    cup_dx = dx - _col(p["cup_shift"])
    return d_disc, _ellipse_radius(cup_dx, dy, cup_r * cup_aspect, cup_r / cup_aspect, tilt)


def _render_scene(x: np.ndarray, y: np.ndarray,
                  p: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clean RGB scene ``[B, 3, H, W]`` and elliptic radii of the visible disc and cup."""
    dx, dy = x - _col(p["cx"]), y - _col(p["cy"])
    d_disc, d_cup = _disc_geometry(dx, dy, p)
    r, side, illum = _col(p["radius"]), _col(p["side"]), _col(p["illum"])
    rho2 = dx * dx + dy * dy
    # Peripapillary glow, and the darker macula on the temporal side.
    shade = 0.88 + 0.12 * np.exp(-rho2 / (2.0 * (2.2 * r) ** 2))
    shade -= 0.3 * np.exp(-((dx - side * 2.6 * r) ** 2 + dy * dy) / (2.0 * (0.9 * r) ** 2))
    texture = _texture(x[0], p) * illum
    bg = _BACKGROUND_RGB[None, :, None, None] * (shade * texture)[:, None]
    rim = _RIM_RGB[None, :, None, None] * texture[:, None]
    # Logistic edges written with tanh, which cannot overflow; cup edges are
    # fuzzier than disc edges and the cup pallor is never complete.
    disc_alpha = (0.5 - 0.5 * np.tanh((d_disc - 1.0) * 10.0))[:, None]
    cup_alpha = (0.45 - 0.45 * np.tanh((d_cup - 1.0) * 5.0))[:, None]
    img = bg + disc_alpha * (rim - bg)
    img += cup_alpha * (_CUP_RGB[None, :, None, None] - img)
    vmap = _vessel_map(np.sqrt(rho2), np.arctan2(dy, dx), p["vessels"])
    img *= 1.0 - 0.8 * vmap[:, None] * _VESSEL_ABSORPTION[None, :, None, None]
    return img.astype(np.float32, copy=False), d_disc, d_cup


def _gaussian_blur(img: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of the two last axes (reflect padding)."""
    if sigma < 0.25:  # below a quarter pixel the kernel is a delta
        return img
    radius = min(int(math.ceil(3.0 * sigma)), img.shape[-1] - 1)
    taps = np.arange(-radius, radius + 1, dtype=np.float32)
    kernel = np.exp(-taps * taps / np.float32(2.0 * sigma * sigma))
    kernel /= kernel.sum()
    n = img.shape[-1]
    for _ in range(2):  # blur the last axis, then swap axes and repeat
        padded = np.pad(img, [(0, 0)] * (img.ndim - 1) + [(radius, radius)], mode="reflect")
        img = kernel[0] * padded[..., 0:n]
        for i in range(1, kernel.size):
            img += kernel[i] * padded[..., i:i + n]
        img = img.swapaxes(-1, -2)
    return img


def _acquire(img: np.ndarray, x: np.ndarray, y: np.ndarray, site: SiteProfile,
             p: dict, rng: np.random.Generator) -> np.ndarray:
    """Apply a site's camera to clean scenes: cast, field of view, blur, tone, noise."""
    gain = np.asarray(site.channel_gain, np.float32) * np.float32(site.brightness) * p["gain"]
    img = img * gain[:, :, None, None]
    r_img = np.sqrt(x * x + y * y)  # lens fall-off, then black outside the field of view
    fov = (1.0 - 0.12 * r_img * r_img) / (1.0 + np.exp((r_img - site.fov_radius) / 0.04))
    img = img * fov.astype(np.float32)
    img = _gaussian_blur(img, site.blur_sigma * img.shape[-1] / _REFERENCE_SIZE)
    mean = img.mean(axis=(2, 3), keepdims=True)
    img = np.clip(mean + np.float32(site.contrast) * (img - mean), 0.0, 1.0)
    img = img ** (np.float32(site.gamma) * p["gamma"])[:, None, None, None]
    img += np.float32(site.noise_std) * rng.standard_normal(img.shape, dtype=np.float32)
    return np.clip(img, 0.0, 1.0, out=img)


def _render_site(rng: np.random.Generator, site: SiteProfile, n: int,
                 size: int) -> tuple[np.ndarray, np.ndarray]:
    """Render ``n`` images and annotated masks of one site, chunk by chunk."""
    coords = (np.arange(size, dtype=np.float32) + 0.5) * np.float32(2.0 / size) - 1.0
    y, x = np.meshgrid(coords, coords, indexing="ij")
    params = _draw_params(rng, site, n)
    images = np.empty((n, 3, size, size), dtype=np.float32)
    masks = np.empty((n, 2, size, size), dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // (size * size))
    for lo in range(0, n, step):
        sl = slice(lo, min(lo + step, n))
        chunk = {k: v[sl] for k, v in params.items() if k != "vessels"}
        chunk["vessels"] = {k: v[sl] for k, v in params["vessels"].items()}
        scene, d_disc, d_cup = _render_scene(x, y, chunk)
        images[sl] = _acquire(scene, x, y, site, chunk, rng)
        # The protocol, not the visible edge, decides where the outline goes.
        disc = d_disc <= 1.0 + _col(chunk["margin"])
        masks[sl, 0] = disc
        masks[sl, 1] = (d_cup <= _col(chunk["cup_scale"])) & disc
    return images, masks


def generate_site(site_index: int, image_size: int = 64, scale: float = 0.5,
                  seed: int = 0, profiles: tuple[SiteProfile, ...] = FUNDUS_SITES) -> SiteSplits:
    """Generate the train/val/test splits of one synthetic fundus site.

    Parameters
    ----------
    site_index : int
        0..5, index into ``FUNDUS_SITES``.
    image_size : int
        Height and width in pixels, >= 32.
    scale : float
        Fraction (> 0) of the paper's site size to generate (at least 8 images).
    seed : int
        Base seed; the site draws from ``np.random.default_rng([seed, site_index])``.
    profiles : tuple of SiteProfile
        The sites to draw from (another annotation protocol keeps every random draw).

    Returns
    -------
    SiteSplits
        Deterministic for ``(site_index, image_size, scale, seed)``. Images are
        float32 ``[N, 3, H, W]`` in [0, 1]; masks float32 ``[N, 2, H, W]``
        (disc, cup) in {0, 1} with the cup inside the disc.
    """
    index = _check_int("site_index", site_index, 0, len(profiles) - 1)
    size = _check_int("image_size", image_size, 32, None)
    n = site_size(index, scale)
    seed = _check_int("seed", seed, 0, None)
    site = profiles[index]
    images, masks = _render_site(np.random.default_rng([seed, index]), site, n, size)
    ids = tuple(f"{site.name}/{i:04d}" for i in range(n))
    # 0.5/0.25/0.25 split: val and test get at least 2, train the remainder.
    n_val = max(2, n // 4)
    bounds = (0, n - 2 * n_val, n - n_val, n)
    splits = [SegArrays(images[a:b], masks[a:b], ids[a:b]) for a, b in pairwise(bounds)]
    return SiteSplits(site.name, *splits)


def generate_sites(num_sites: int = 6, image_size: int = 64, scale: float = 0.5,
                   seed: int = 0) -> list[SiteSplits]:
    """Generate the first ``num_sites`` (1..6) sites; see :func:`generate_site`."""
    count = _check_int("num_sites", num_sites, 1, len(FUNDUS_SITES))
    return [generate_site(i, image_size, scale, seed) for i in range(count)]
