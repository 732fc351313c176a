"""Simulated malicious sites, for measuring robust aggregation (simulation only; never in a deployment).

The threat model: a compromised site can send any finite, well-shaped update
with any ``num-examples`` >= 1. ``attack = "site-6:sign-flip"`` (several:
``"site-5:noise,site-6:sign-flip"``) makes the named simulated sites send:

``sign-flip``
    ``w - s (w_k - w)``: its honest update reversed and scaled by ``s``
    (``attack-scale``), for the global model (FedSM's selector and personalized model stay honest:
    ``poison-personalized`` attacks the latter).
``noise``
    ``w + xi`` with Gaussian ``xi`` of ``s`` times the honest update's norm.
``label-flip``
    An honest update on inverted masks (``1 - y``): plausible and well shaped.
``inflate-count``
    Its honest update, claiming 100 times its training images.
``poison-personalized``
    FedSM: its personalized model sign-flipped (as ``sign-flip``, from the
    personalized model it received), so SoftPull carries it to every site.
``fake-statistics``
    FedSM: the selector-head statistics of another site's images instead of
    its own, to re-route everyone's images.

The ServerApp refuses the key when the nodes are deployment SuperNodes, and
the ClientApp attacks only as a simulated node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from fedsm_core.checks import check_choice, check_settings, setting
from fedsm_core.models.weights import Weights, check_same_layout

ATTACKS = ("sign-flip", "noise", "label-flip", "inflate-count", "poison-personalized", "fake-statistics")
FEDSM_ONLY = ("poison-personalized", "fake-statistics")
INFLATION = 100  # inflate-count: the factor a site multiplies its claimed training images by


@dataclasses.dataclass(frozen=True)
class AttackSettings:
    """Which simulated sites attack, how, and how hard.

    Attributes
    ----------
    plan : str
        ``"<site>:<attack>"`` items separated by commas; empty for none (``attack``).
    scale : float
        ``s`` of ``sign-flip``, ``noise`` and ``poison-personalized`` (``attack-scale``).
    """

    plan: str = setting("", "attack", allowed="`<site>:<attack>` items, comma-separated: " + ", ".join(
        f"`{name}`" for name in ATTACKS))
    scale: float = setting(1.0, "attack-scale", low=0.0, high=1e6)

    def __post_init__(self) -> None:
        check_settings(self)
        for site, kind in self.items():
            if not site:
                raise ValueError(f"attack = '{self.plan}': '{site}:{kind}' names no site; write '<site>:<attack>'")
            check_choice(f"attack of '{site}'", kind, ATTACKS)

    def items(self) -> list[tuple[str, str]]:
        """``(site, attack)`` pairs of the plan, in order."""
        pairs = []
        for item in filter(None, (part.strip() for part in self.plan.split(","))):
            if ":" not in item:
                raise ValueError(f"attack = '{self.plan}': '{item}' is not '<site>:<attack>' (e.g. 'site-6:sign-flip')")
            site, kind = (text.strip() for text in item.rsplit(":", 1))
            pairs.append((site, kind))
        return pairs

    def of(self, site: str) -> tuple[str, ...]:
        """The attacks site ``site`` makes (empty for an honest site)."""
        return tuple(kind for name, kind in self.items() if name == site)

    @property
    def sites(self) -> tuple[str, ...]:
        """The malicious sites, in plan order."""
        return tuple(dict.fromkeys(site for site, _ in self.items()))


def sign_flipped(received: Mapping[str, np.ndarray], trained: Mapping[str, np.ndarray], scale: float) -> Weights:
    """``w - s (w_k - w)`` per float array (float64 inside, the array's dtype out); counters stay honest."""
    check_same_layout(received, trained, "attacked model")
    return {key: _float_update(received[key], trained[key], lambda w, update: w - scale * update)
            for key in received}


def noised(received: Mapping[str, np.ndarray], trained: Mapping[str, np.ndarray], scale: float,
           rng: np.random.Generator) -> Weights:
    """``w + xi``, Gaussian ``xi`` with ``||xi|| = s ||w_k - w||`` over all float arrays together."""
    check_same_layout(received, trained, "attacked model")
    floats = [key for key in received if np.issubdtype(np.asarray(received[key]).dtype, np.floating)]
    honest = np.sqrt(sum(float(np.sum((np.asarray(trained[k], np.float64) - np.asarray(received[k], np.float64)) ** 2))
                         for k in floats))
    draws = {key: rng.standard_normal(np.shape(received[key])) for key in floats}
    norm = np.sqrt(sum(float(np.sum(d ** 2)) for d in draws.values())) or 1.0
    out = {key: np.array(value, copy=True) for key, value in trained.items()}
    for key in floats:
        value = np.asarray(received[key], np.float64) + draws[key] * (scale * honest / norm)
        out[key] = value.astype(np.asarray(received[key]).dtype)
    return out


def _float_update(received: np.ndarray, trained: np.ndarray, rule) -> np.ndarray:
    dtype = np.asarray(trained).dtype
    if not np.issubdtype(dtype, np.floating):
        return np.array(trained, copy=True)
    w = np.asarray(received, dtype=np.float64)
    return rule(w, np.asarray(trained, dtype=np.float64) - w).astype(dtype)
