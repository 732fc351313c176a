"""Cases (simulated patients) of the synthetic prostate dataset: stacks of axial slices.

:mod:`fedsm_core.data.synthetic_prostate` draws one scene per case (anatomy
and scan) and renders 2-D slices; this module turns a case into its stack.
A slice at index ``z`` of a ``k``-slice case cuts the gland at height

    ``t = (z - (k - 1) / 2 - shift * (k / 2) * (1 - fill)) / (k * fill / 2)``,

-1 at the apex and 1 at the base (``z`` grows towards the head). The gland
spans ``fill`` (0.7..0.9) of the stack, so about ``(1 - fill) * k`` end
slices miss it, as in real MRI; its cross-section follows a superellipsoid,
``(1 - |t|^2.5)^0.4``, a little wider at the base. Tissue texture varies
smoothly along ``z``, and the scan (gain, bias field, zoom) is shared by a case.

A site's slice budget ``n`` is shared by :func:`case_count` cases, of about
:data:`SLICES_PER_CASE` slices each (+-20 %). Whole cases, in generation order,
go to train/val/test (:func:`split_bounds`); ids read ``"<site>/<case>/z012"``
(:func:`case_ids`), as those of the NIfTI loader.
"""

from __future__ import annotations

import numpy as np

# Average slices per case, and the fewest cases a site has (2 train, 2 val, 2 test).
SLICES_PER_CASE = 12
MIN_CASES = 6
# Nominal geometry of a scan: slice spacing and the image width at zoom 1. A
# 12-slice case then holds a gland about 30 mm long and 40 mm wide.
SLICE_SPACING_MM = 3.6
FIELD_OF_VIEW_MM = 160.0


def case_count(num_slices: int) -> int:
    """Cases sharing a slice budget: ``max(6, round(num_slices / 12))``.

    Six cases at least, so that val and test get two each and train two or
    more: below 72 slices (e.g. ``data-scale = 0.1``) cases hold fewer than 12.
    """
    if isinstance(num_slices, bool) or not isinstance(num_slices, (int, np.integer)) or num_slices < MIN_CASES:
        raise ValueError(f"num_slices must be an integer >= {MIN_CASES} (one slice per case), got {num_slices!r}")
    return max(MIN_CASES, round(num_slices / SLICES_PER_CASE))


def case_sizes(rng: np.random.Generator, num_slices: int, cases: int) -> np.ndarray:
    """Slices ``[cases]`` of each case, summing to ``num_slices``: one each, the rest shared within +-20 %."""
    weights = np.cumsum(rng.uniform(0.8, 1.2, cases))
    edges = np.round((num_slices - cases) * weights / weights[-1]).astype(int)
    return 1 + np.diff(edges, prepend=0)


def split_bounds(sizes: np.ndarray) -> list[int]:
    """Slice bounds ``[0, a, b, n]`` of train ``[0, a)``, val ``[a, b)`` and test ``[b, n)``.

    Whole cases in order, 0.5/0.25/0.25 of them: val and test get
    ``max(2, cases // 4)`` cases each, train the rest (6 cases -> 2/2/2,
    11 -> 7/2/2, 16 -> 8/4/4).
    """
    cases = len(sizes)
    n_val = max(2, cases // 4)
    starts = np.concatenate([[0], np.cumsum(sizes)])  # first slice of each case, then n
    return starts[[0, cases - 2 * n_val, cases - n_val, cases]].tolist()


def case_ids(site: str, sizes: np.ndarray) -> tuple[str, ...]:
    """Slice ids ``"<site>/case007/z012"``, case by case and in ``z`` order within a case."""
    return tuple(f"{site}/case{c:03d}/z{z:03d}" for c, k in enumerate(sizes.tolist()) for z in range(k))


def gland_heights(sizes: np.ndarray, fill: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Height ``t`` ``[N]`` of every slice in its case's gland (module docstring).

    ``fill`` and ``shift`` (-0.5..0.5: where the empty end slices go) are per case.
    """
    owner = np.repeat(np.arange(len(sizes)), sizes)
    k, fill = sizes[owner].astype(np.float64), fill[owner].astype(np.float64)
    z = np.arange(len(owner)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    half = 0.5 * k * fill
    return ((z - 0.5 * (k - 1.0) - shift[owner] * (0.5 * k - half)) / half).astype(np.float32)


def slice_params(case: dict, sizes: np.ndarray) -> dict:
    """Per-slice scene parameters ``[N]`` of cases of ``sizes`` slices.

    ``case`` holds the per-case parameters of the scene generator; a slice
    copies those of its case, then cuts the gland at its height ``t``:
    gland radius, centre drift and outline phases follow ``t``, the bladder
    appears above ``bladder_base`` and grows towards the head, the femoral
    heads shrink away from mid-gland. ``present`` is 0 where the slice misses the gland.
    """
    owner = np.repeat(np.arange(len(sizes)), sizes)
    p = {key: value[owner] for key, value in case.items()}
    t = gland_heights(sizes, case["fill"], case["z_shift"])
    profile = np.clip(1.0 - np.abs(t) ** 2.5, 0.0, None) ** 0.4 * (1.0 + 0.1 * t)
    p["present"] = (profile > 0).astype(np.float32)
    p["gland_h"] = p["gland_r"] / p["gland_aspect"]  # bladder and rectum keep their place
    p["gland_r"] = p["gland_r"] * np.maximum(profile, 1e-3)
    p["gland_cx"] = p["gland_cx"] + p["drift_x"] * t
    p["gland_cy"] = p["gland_cy"] + p["drift_y"] * t
    p["harm_phase"] = p["harm_phase"] + p["harm_drift"] * t[:, None]
    bladder = np.sqrt(np.clip((t - p["bladder_base"]) / 0.6, 0.0, 1.0))
    p["bladder"] = (bladder > 0).astype(np.float32)
    p["bladder_rx"] = p["bladder_rx"] * np.maximum(bladder, 1e-3)
    p["bladder_ry"] = p["bladder_ry"] * np.maximum(bladder, 1e-3)
    p["bone_r"] = p["bone_r"] * (1.0 - 0.1 * np.minimum(t * t, 2.0))
    return {key: np.asarray(value, dtype=np.float32) for key, value in p.items()}


def z_smooth_noise(rng: np.random.Generator, sizes: np.ndarray, shape: tuple[int, ...], step: int) -> np.ndarray:
    """Gaussian fields ``[N, *shape]``, smooth along ``z`` within each case, each value of unit variance.

    Each case draws a field about every ``step`` slices; a slice between two
    mixes them linearly, with weights of unit norm so the variance stays 1.
    """
    fields = []
    for k in sizes.tolist():
        count = k // step + 2
        pos = np.linspace(0.0, count - 1.0, k)
        lo = np.minimum(np.floor(pos).astype(int), count - 2)
        weights = np.zeros((k, count))
        weights[np.arange(k), lo] = 1.0 - (pos - lo)
        weights[np.arange(k), lo + 1] = pos - lo
        weights /= np.linalg.norm(weights, axis=1, keepdims=True)
        fields.append(np.tensordot(weights, rng.standard_normal((count, *shape)), axes=1))
    return np.concatenate(fields).astype(np.float32)
