"""Settings of kNN-Per (Marfoq et al., ICML 2022), checked once when parsed."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from fedsm_core.algorithms.knn_per.datastore import REPLACEMENTS
from fedsm_core.algorithms.knn_per.search import BACKENDS
from fedsm_core.config import RunConfig

# 0.0, 0.1, ..., 1.0: lam = 0 is the global model alone, lam = 1 the kNN estimate alone.
LAMBDA_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))

# Field -> config key; `lam` is spelled out in code but reads as "lambda" in the config.
KEYS: dict[str, str] = {
    "k": "knn-k",
    "kernel_scale": "knn-kernel-scale",
    "capacity": "knn-capacity",
    "pixels_per_image": "knn-pixels-per-image",
    "replacement": "knn-replacement",
    "backend": "knn-backend",
    "lambda_grid": "knn-lambda-grid",
    "lam": "knn-lambda",
    "batch_size": "knn-batch-size",
    "seed": "knn-seed",
}


@dataclasses.dataclass(frozen=True)
class KNNPerSettings:
    """How a client builds its datastore, searches it and mixes the estimates.

    Attributes
    ----------
    k : int
        Neighbours per query pixel (``knn-k``).
    kernel_scale : float
        ``scale`` of the kernel ``w = exp(-d^2 / (dim * scale))`` (``knn-kernel-scale``).
    capacity : int
        Most pixels the datastore holds (``knn-capacity``).
    pixels_per_image : int
        Pixels sampled from each training image (``knn-pixels-per-image``).
    replacement : {"fifo", "random"}
        Which entry a new one replaces once the store is full (``knn-replacement``).
    backend : {"auto", "faiss", "torch"}
        Neighbour search (``knn-backend``); ``"auto"`` prefers faiss on CPU.
    lambda_grid : tuple of float
        Candidates for ``lam`` on validation, each in ``[0, 1]`` (``knn-lambda-grid``).
    lam : float
        Mixing weight used until :meth:`KNNPer.choose_lambda` picks one (``knn-lambda``).
    batch_size : int
        Images per forward pass (``knn-batch-size``).
    seed : int
        Seeds pixel sampling and random replacement (``knn-seed``).
    """

    # The run config's defaults, so the two never disagree
    k: int = RunConfig.knn_k
    kernel_scale: float = RunConfig.knn_kernel_scale
    capacity: int = RunConfig.knn_capacity
    pixels_per_image: int = RunConfig.knn_pixels_per_image
    replacement: str = "fifo"
    backend: str = "auto"
    lambda_grid: tuple[float, ...] = LAMBDA_GRID
    lam: float = 0.5
    batch_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "lambda_grid", tuple(float(v) for v in self.lambda_grid))
        for name in ("k", "capacity", "pixels_per_image", "batch_size"):
            _check_at_least(KEYS[name], getattr(self, name), 1)
        _check_at_least(KEYS["seed"], self.seed, 0)
        if not (math.isfinite(self.kernel_scale) and self.kernel_scale > 0):
            raise ValueError(f"{KEYS['kernel_scale']} = {self.kernel_scale} must be a finite number > 0")
        _check_choice(KEYS["replacement"], self.replacement, REPLACEMENTS)
        _check_choice(KEYS["backend"], self.backend, BACKENDS)
        if not self.lambda_grid:
            raise ValueError(f"{KEYS['lambda_grid']} is empty; give values in [0, 1], e.g. '0.0,0.5,1.0'")
        for key, value in [(KEYS["lambda_grid"], v) for v in self.lambda_grid] + [(KEYS["lam"], self.lam)]:
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{key} value {value} is outside [0, 1]")

    @classmethod
    def from_run_config(cls, config: RunConfig) -> KNNPerSettings:
        """The settings a run's sites use: its ``knn-*`` keys and its ``seed``; the rest take their defaults."""
        return cls(k=config.knn_k, kernel_scale=config.knn_kernel_scale, capacity=config.knn_capacity,
                   pixels_per_image=config.knn_pixels_per_image, seed=config.seed)


def _check_at_least(key: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} = {value!r} must be an integer >= {low}")
    if value < low:
        raise ValueError(f"{key} = {value} must be >= {low}")


def _check_choice(key: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{key} = '{value}' is not one of {list(choices)}")
