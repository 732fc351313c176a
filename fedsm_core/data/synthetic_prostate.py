"""Deterministic six-site synthetic prostate MR dataset: cases of axial slices.

The high-similarity counterpart of :mod:`fedsm_core.data.synthetic_fundus`.
Each simulated patient (a *case*) has one 3-D gland, ellipsoid-like with an
irregular outline, and contributes a stack of neighbouring axial slices
through it (:mod:`fedsm_core.data.synthetic_prostate_cases`: the end slices
may miss the gland). Each slice is a grey T2-like image of the pelvis: dark air
around an elliptical body with a bright subcutaneous fat rim, smooth
soft-tissue texture, bright femoral-head-like rings at the sides, a bright
bladder-like blob in front of (above) the gland in its upper slices, a dark
rectum-like blob behind (below) it, and a darker gland with a brighter
posterior peripheral zone. The mask has one binary channel: 0 = prostate gland.
The grey slice is replicated into 3 identical channels: the whole toolkit
(U-Net encoders, selector, style augmentation) takes 3-channel input.

The six sites imitate the prostate MRI sources used by FedSM (RUNMC, BMC,
I2CVB, UCL, BIDMC, HK) and differ only mildly, in acquisition alone:
intensity scale, a smooth multiplicative bias field (strength and direction,
fixed per scan), Rician noise level, resolution (blur and down-and-up
sampling) and a slight field-of-view zoom. Anatomy and annotation protocol are
shared by all sites (no label shift): the mask is the visible gland everywhere.

A site has :func:`site_size` slices (the paper's count times ``scale``) in
``case_count(site_size)`` cases of about 12 slices; whole cases go to
train/val/test. Ids read ``"<site>/<case>/z012"`` (``"site-2/case004/z007"``),
as the NIfTI loader's. Site ``i`` draws from ``np.random.default_rng([seed, i])``
alone, so a client can generate its own site without the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from fedsm_core.data.arrays import SegArrays, SiteSplits
from fedsm_core.data.cases import named_case

# Shared with the fundus generator so both datasets validate arguments and
# word their errors identically.
from fedsm_core.data.synthetic_fundus import _check_int, _check_scale, _col, _ellipse_radius
from fedsm_core.data.synthetic_prostate_cases import (
    FIELD_OF_VIEW_MM,
    SLICE_SPACING_MM,
    case_count,
    case_ids,
    case_sizes,
    slice_params,
    split_bounds,
    z_smooth_noise,
)

__all__ = ["FIELD_OF_VIEW_MM", "PAPER_SITE_SIZES", "PROSTATE_SITES", "SLICE_SPACING_MM", "SegArrays",
           "SiteProfile", "SiteSplits", "case_count", "generate_site", "generate_sites", "site_size", "voxel_spacing"]

# Slices per site in the FedSM prostate setting (RUNMC, BMC, I2CVB, UCL, BIDMC, HK).
PAPER_SITE_SIZES: tuple[int, ...] = (261, 384, 158, 468, 421, 175)

# Pixel-sized parameters are given for 64 px and rescaled: same look at any size.
_REFERENCE_SIZE = 64
# Float32 elements of one [B, H, W] plane per rendering chunk: bounds memory at
# 256 px while keeping numpy calls large at 64 px.
_CHUNK_ELEMENTS = 1 << 20
# Node counts of the two octaves of smooth tissue texture, and the slices between
# their draws along z; fixed, so the anatomy of a case does not depend on pixel size.
_TEXTURE_NODES = (5, 9)
_TEXTURE_Z_STEP = (3, 2)


@dataclass(frozen=True)
class SiteProfile:
    """Acquisition protocol of one synthetic site (the anatomy is shared).

    Lengths are normalised (image half-width = 1), pixel sizes for 64 px.
    """

    name: str  # "site-1" .. "site-6"
    intensity_scale: float  # global receive gain
    bias_strength: float  # bias field = exp(strength * distance along bias_angle)
    bias_angle: float  # direction of increasing bias, degrees; 90 = posterior (down)
    noise_std: float  # std of each component of the complex (Rician) noise
    blur_sigma: float  # Gaussian point-spread sigma, pixels at 64 px
    downsample: float  # acquired voxels are this many pixels wide, then upsampled
    zoom: float  # field of view: > 1 magnifies the anatomy


PROSTATE_SITES: tuple[SiteProfile, ...] = (
    # RUNMC-like: 3T surface coil, clean and sharp, weak vertical bias.
    SiteProfile("site-1", 1.00, 0.10, -90.0, 0.020, 0.3, 1.00, 1.00),
    # BMC-like: 1.5T with endorectal coil, bright posterior, coarser voxels.
    SiteProfile("site-2", 0.95, 0.20, 80.0, 0.030, 0.5, 1.25, 1.04),
    # I2CVB-like: 3T, high SNR, bias towards the patient's right (image left).
    SiteProfile("site-3", 1.05, 0.14, 180.0, 0.015, 0.2, 1.00, 0.96),
    # UCL-like: mixed 1.5T/3T, thick and blurred.
    SiteProfile("site-4", 0.97, 0.15, 20.0, 0.025, 0.6, 1.50, 1.02),
    # BIDMC-like: 3T with endorectal coil, noisy, bias down and to the left.
    SiteProfile("site-5", 1.04, 0.20, 130.0, 0.035, 0.4, 1.25, 0.98),
    # HK-like: 1.5T, low resolution, mild bias to the right.
    SiteProfile("site-6", 0.93, 0.12, -15.0, 0.030, 0.8, 2.00, 1.03),
)


def site_size(site_index: int, scale: float) -> int:
    """Slice budget of a site: ``max(8, round(PAPER_SITE_SIZES[i] * scale))``."""
    index = _check_int("site_index", site_index, 0, len(PROSTATE_SITES) - 1)
    return max(8, round(PAPER_SITE_SIZES[index] * _check_scale(scale)))


def voxel_spacing(site_index: int, image_size: int) -> tuple[float, float, float]:
    """Nominal ``(z, y, x)`` voxel spacing in mm of a generated case.

    ``(SLICE_SPACING_MM, FIELD_OF_VIEW_MM / (zoom * image_size), same)``, with
    the site's ``zoom``; patients vary about 3 % in size around it. For per-case
    metrics in mm (surface distances, volumes).
    """
    index = _check_int("site_index", site_index, 0, len(PROSTATE_SITES) - 1)
    pixel = FIELD_OF_VIEW_MM / (PROSTATE_SITES[index].zoom * _check_int("image_size", image_size, 32, None))
    return SLICE_SPACING_MM, pixel, pixel


def _interp_matrix(n_out: int, n_in: int) -> np.ndarray:
    """Linear interpolation ``[n_out, n_in]`` between pixel centres, edges clamped."""
    t = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0, n_in - 1)
    lo = np.floor(t).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    weight = t - lo
    matrix = np.zeros((n_out, n_in))
    np.add.at(matrix, (np.arange(n_out), lo), 1.0 - weight)
    np.add.at(matrix, (np.arange(n_out), hi), weight)
    return matrix


def _area_matrix(n_out: int, n_in: int) -> np.ndarray:
    """Box downsampling ``[n_out, n_in]``: each big voxel averages what it covers.

    Works for non-integer factors, which is why it is written as interval overlaps.
    """
    edges_out = np.linspace(0.0, n_in, n_out + 1)
    edges_in = np.arange(n_in + 1, dtype=float)
    overlap = (np.minimum(edges_out[1:, None], edges_in[None, 1:])
               - np.maximum(edges_out[:-1, None], edges_in[None, :-1]))
    overlap = np.maximum(overlap, 0.0)
    return overlap / overlap.sum(axis=1, keepdims=True)


def _blur_matrix(n: int, sigma: float) -> np.ndarray:
    """Gaussian blur ``[n, n]``; rows renormalised so edges keep their brightness."""
    if sigma < 0.25:  # below a quarter pixel the kernel is a delta
        return np.eye(n)
    taps = np.arange(n, dtype=float)
    kernel = np.exp(-((taps[:, None] - taps[None, :]) ** 2) / (2.0 * sigma * sigma))
    return kernel / kernel.sum(axis=1, keepdims=True)


def _resolution_matrix(size: int, site: SiteProfile) -> np.ndarray:
    """One ``[size, size]`` operator: point-spread blur, big voxels, upsampling.

    All three steps are linear and separable, so they fold into a single matrix
    applied as ``R @ img @ R.T``: two batched matmuls instead of a convolution.
    """
    low = max(8, round(size / site.downsample))
    blur = _blur_matrix(size, site.blur_sigma * size / _REFERENCE_SIZE)
    matrix = _interp_matrix(size, low) @ _area_matrix(low, size) @ blur
    return matrix.astype(np.float32)


def _draw_cases(rng: np.random.Generator, site: SiteProfile, n: int) -> dict:
    """Draw every per-case anatomy and acquisition parameter, each of leading size ``n``."""
    u = rng.uniform
    p = {
        "zoom": site.zoom * np.exp(rng.normal(0.0, 0.03, n)),  # patient size varies too
        "body_ax": u(0.78, 0.90, n), "body_ay": u(0.58, 0.68, n),
        "body_cy": rng.normal(0.02, 0.02, n), "tissue": u(0.38, 0.46, n),
        "gland_cx": rng.normal(0.0, 0.03, n), "gland_cy": u(0.02, 0.12, n),
        "gland_r": u(0.19, 0.28, n), "gland_aspect": u(1.05, 1.25, n),
        "gland_tilt": rng.normal(0.0, 0.08, n), "gland_dark": u(0.45, 0.62, n),
        # Low-order radius harmonics (k = 2, 3, 4) make the outline irregular.
        "harm_amp": u(0.0, 0.07, (n, 3)) * np.array([1.0, 0.7, 0.5]),
        "harm_phase": u(0.0, 2.0 * np.pi, (n, 3)),
        # Along z: share of the stack the gland spans, its offset, drifts per unit height.
        "fill": u(0.70, 0.90, n), "z_shift": u(-0.5, 0.5, n),
        "drift_x": rng.normal(0.0, 0.01, n), "drift_y": rng.normal(0.0, 0.03, n),
        "harm_drift": rng.normal(0.0, 0.4, (n, 3)),
        "bladder_base": u(-0.6, 0.2, n),  # gland height where the bladder appears
        "bladder_rx": u(0.20, 0.34, n), "bladder_ry": u(0.10, 0.17, n),
        "bladder_gap": u(0.02, 0.07, n), "bladder_dx": rng.normal(0.0, 0.04, n),
        "rectum_r": u(0.08, 0.12, n), "rectum_aspect": u(1.0, 1.4, n),
        "rectum_gap": u(0.01, 0.04, n),
        "bone_x": u(0.50, 0.60, n), "bone_dy": rng.normal(0.0, 0.04, n),
        "bone_r": u(0.10, 0.14, n),
        "gain": site.intensity_scale * rng.normal(1.0, 0.03, n),
        "bias_strength": site.bias_strength * u(0.8, 1.2, n),
        "bias_angle": np.deg2rad(site.bias_angle) + rng.normal(0.0, 0.25, n),
    }
    return {k: np.asarray(v, dtype=np.float32) for k, v in p.items()}


def _inside(d: np.ndarray, width: float) -> np.ndarray:
    """Soft indicator of ``d < 1``; tanh cannot overflow, unlike a logistic."""
    return 0.5 - 0.5 * np.tanh((d - 1.0) * np.float32(1.0 / width))


def _smooth_field(grid: np.ndarray, size: int) -> np.ndarray:
    """Bilinear upsampling of node grids ``[B, k, k]`` to ``[B, size, size]``."""
    up = _interp_matrix(size, grid.shape[-1]).astype(np.float32)
    return up @ grid @ up.T


def _gland(xs: np.ndarray, ys: np.ndarray, p: dict) -> tuple[np.ndarray, np.ndarray]:
    """Radius normalised to the irregular outline (1 on the edge) and polar angle."""
    r, aspect, tilt = _col(p["gland_r"]), _col(p["gland_aspect"]), _col(p["gland_tilt"])
    dx, dy = xs - _col(p["gland_cx"]), ys - _col(p["gland_cy"])
    cos, sin = np.cos(tilt), np.sin(tilt)
    gu = (dx * cos + dy * sin) / (r * aspect)
    gv = (dy * cos - dx * sin) / (r / aspect)
    theta = np.arctan2(gv, gu)
    outline = np.ones_like(theta)
    for k in range(3):
        amp, phase = _col(p["harm_amp"][:, k]), _col(p["harm_phase"][:, k])
        outline += amp * np.cos((k + 2) * theta + phase)
    return np.sqrt(gu * gu + gv * gv) / outline, theta


def _organs(xs: np.ndarray, ys: np.ndarray, p: dict) -> tuple[np.ndarray, ...]:
    """Soft masks of the body, fat rim, bone rings, bladder and rectum, ``[B, H, W]``."""
    zero = np.float32(0.0)
    d_body = _ellipse_radius(xs, ys - _col(p["body_cy"]), _col(p["body_ax"]),
                             _col(p["body_ay"]), zero)
    fat = np.exp(-(((d_body - 0.92) * np.float32(20.0)) ** 2))
    gx, gy = _col(p["gland_cx"]), _col(p["gland_cy"])
    half_height = _col(p["gland_h"])
    bone_y, bone_r = gy + _col(p["bone_dy"]), _col(p["bone_r"])
    bones = np.zeros_like(xs)
    for sign in (-1.0, 1.0):  # femoral heads sit symmetrically left and right
        dist = np.hypot(xs - sign * _col(p["bone_x"]), ys - bone_y) / bone_r
        bones = np.maximum(bones, np.exp(-(((dist - 1.0) * np.float32(5.0)) ** 2)))
    # Bladder in front of (above) and rectum behind (below) the gland, with gaps.
    b_rx, b_ry = _col(p["bladder_rx"]), _col(p["bladder_ry"])
    b_cy = gy - half_height - _col(p["bladder_gap"]) - b_ry
    d_bladder = _ellipse_radius(xs - gx - _col(p["bladder_dx"]), ys - b_cy, b_rx, b_ry, zero)
    r_rx = _col(p["rectum_r"] * p["rectum_aspect"])
    r_ry = _col(p["rectum_r"] / p["rectum_aspect"])
    r_cy = gy + half_height + _col(p["rectum_gap"]) + r_ry
    d_rectum = _ellipse_radius(xs - gx, ys - r_cy, r_rx, r_ry, zero)
    bladder = _inside(d_bladder, 0.08) * _col(p["bladder"])
    return _inside(d_body, 0.02), fat, bones, bladder, _inside(d_rectum, 0.15)


def _render_scene(x: np.ndarray, y: np.ndarray, p: dict) -> tuple[np.ndarray, np.ndarray]:
    """Clean grey slices ``[B, H, W]`` and the gland's normalised radius."""
    zoom = _col(p["zoom"])
    xs, ys = x / zoom, y / zoom  # anatomy coordinates: zoom > 1 magnifies
    body, fat, bones, bladder, rectum = _organs(xs, ys, p)
    size = x.shape[-1]
    texture = (1.0 + 0.12 * _smooth_field(p["tex_coarse"], size)
               + 0.06 * _smooth_field(p["tex_fine"], size))
    img = _col(p["tissue"]) * texture + 0.30 * fat + 0.30 * bones
    img += bladder * (0.72 - img)
    img += rectum * (0.10 - img)
    d_gland, theta = _gland(xs, ys, p)
    # T2: dark central gland, brighter peripheral zone at the back (+v side).
    peripheral = np.clip(np.sin(theta), 0.0, None) * np.clip((d_gland - 0.55) * 3.0, 0.0, 1.0)
    gland = _col(p["tissue"] * p["gland_dark"]) * texture * (1.0 + 0.35 * peripheral)
    img += _inside(d_gland, 0.12) * (gland - img)
    return (img * body).astype(np.float32, copy=False), d_gland


def _acquire(img: np.ndarray, x: np.ndarray, y: np.ndarray, site: SiteProfile, p: dict,
             resolution: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Apply a site's scanner to clean slices: gain, bias field, resolution, Rician noise."""
    angle = _col(p["bias_angle"])
    # The bias field is fixed to the coil, so it lives in image, not anatomy, coordinates.
    bias = np.exp(_col(p["bias_strength"]) * (x * np.cos(angle) + y * np.sin(angle)))
    img = img * bias * _col(p["gain"])
    img = resolution @ img @ resolution.T
    # Magnitude of a complex signal with Gaussian noise: Rician, never negative,
    # and a noise floor in the air instead of exact zeros.
    sigma = np.float32(site.noise_std)
    real = img + sigma * rng.standard_normal(img.shape, dtype=np.float32)
    img = np.hypot(real, sigma * rng.standard_normal(img.shape, dtype=np.float32))
    return np.clip(img, 0.0, 1.0, out=img)


def _render_site(rng: np.random.Generator, site: SiteProfile, sizes: np.ndarray,
                 size: int) -> tuple[np.ndarray, np.ndarray]:
    """Render the slices and gland masks of cases of ``sizes`` slices, chunk by chunk."""
    coords = (np.arange(size, dtype=np.float32) + 0.5) * np.float32(2.0 / size) - 1.0
    y, x = np.meshgrid(coords, coords, indexing="ij")
    params = slice_params(_draw_cases(rng, site, len(sizes)), sizes)
    params["tex_coarse"], params["tex_fine"] = (z_smooth_noise(rng, sizes, (nodes, nodes), step)
                                                for nodes, step in zip(_TEXTURE_NODES, _TEXTURE_Z_STEP, strict=True))
    resolution = _resolution_matrix(size, site)
    n = int(sizes.sum())
    images = np.empty((n, 3, size, size), dtype=np.float32)
    masks = np.empty((n, 1, size, size), dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // (size * size))
    for lo in range(0, n, step):
        sl = slice(lo, min(lo + step, n))
        chunk = {k: v[sl] for k, v in params.items()}
        scene, d_gland = _render_scene(x, y, chunk)
        images[sl] = _acquire(scene, x, y, site, chunk, resolution, rng)[:, None]
        # Same protocol at every site: the annotated outline is the visible edge.
        masks[sl, 0] = (d_gland <= 1.0) & (_col(chunk["present"]) > 0)
    return images, masks


def generate_site(site_index: int, image_size: int = 64, scale: float = 0.5,
                  seed: int = 0) -> SiteSplits:
    """Generate the train/val/test splits of one synthetic prostate site, by case.

    Parameters
    ----------
    site_index : int
        0..5, index into ``PROSTATE_SITES``.
    image_size : int
        Height and width in pixels, >= 32.
    scale : float
        Fraction (> 0) of the paper's slice count to generate: :func:`site_size`
        slices (at least 8) in ``case_count(site_size)`` cases (at least 6).
    seed : int
        Base seed; the site draws from ``np.random.default_rng([seed, site_index])``.

    Returns
    -------
    SiteSplits
        Deterministic for ``(site_index, image_size, scale, seed)``. Images are
        float32 ``[N, 3, H, W]`` in [0, 1], one grey slice in 3 identical
        channels; masks float32 ``[N, 1, H, W]`` (gland) in {0, 1}, empty on
        slices beyond the gland. Ids ``"<site>/<case>/z012"``, the slices of a
        case consecutive and in z order; no case is in two splits.
    """
    index = _check_int("site_index", site_index, 0, len(PROSTATE_SITES) - 1)
    size = _check_int("image_size", image_size, 32, None)
    n = site_size(index, scale)
    seed = _check_int("seed", seed, 0, None)
    site = PROSTATE_SITES[index]
    rng = np.random.default_rng([seed, index])
    sizes = case_sizes(rng, n, case_count(n))
    images, masks = _render_site(rng, site, sizes, size)
    ids = case_ids(site.name, sizes)
    # Whole cases in order, 0.5/0.25/0.25: val and test get at least 2, train the rest.
    spacing = voxel_spacing(index, size)  # nominal: the generated patients vary about 3 % around it
    spacings = {case: spacing for case in {named_case(i) for i in ids} if case is not None}
    splits = [SegArrays(images[a:b], masks[a:b], ids[a:b], spacings) for a, b in pairwise(split_bounds(sizes))]
    return SiteSplits(site.name, *splits)


def generate_sites(num_sites: int = 6, image_size: int = 64, scale: float = 0.5,
                   seed: int = 0) -> list[SiteSplits]:
    """Generate the first ``num_sites`` (1..6) sites; see :func:`generate_site`."""
    count = _check_int("num_sites", num_sites, 1, len(PROSTATE_SITES))
    return [generate_site(i, image_size, scale, seed) for i in range(count)]
