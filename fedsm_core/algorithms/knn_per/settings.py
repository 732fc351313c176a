"""Settings of kNN-Per (Marfoq et al., ICML 2022), checked once when parsed."""

from __future__ import annotations

import dataclasses

from fedsm_core.algorithms.knn_per.datastore import REPLACEMENTS
from fedsm_core.algorithms.knn_per.search import BACKENDS
from fedsm_core.checks import check_integer, check_range, check_settings, setting

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

    k: int = setting(10, "knn-k", low=1, high=10_000)
    kernel_scale: float = setting(1.0, "knn-kernel-scale", low=1e-9, high=1e9)
    capacity: int = setting(50_000, "knn-capacity", low=1, high=10**9)
    pixels_per_image: int = setting(256, "knn-pixels-per-image", low=1, high=10**8)
    replacement: str = setting("fifo", "knn-replacement", choices=REPLACEMENTS)
    backend: str = setting("auto", "knn-backend", choices=BACKENDS)
    lambda_grid: tuple[float, ...] = LAMBDA_GRID
    lam: float = setting(0.5, "knn-lambda", low=0.0, high=1.0)
    batch_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "lambda_grid", tuple(float(v) for v in self.lambda_grid))
        check_settings(self)
        for name in ("k", "capacity", "pixels_per_image", "batch_size"):
            check_integer(KEYS[name], getattr(self, name), 1)
        check_integer(KEYS["seed"], self.seed, 0)
        if not self.lambda_grid:
            raise ValueError(f"{KEYS['lambda_grid']} is empty; give values in [0, 1], e.g. '0.0,0.5,1.0'")
        for value in self.lambda_grid:
            check_range(KEYS["lambda_grid"], value, 0.0, 1.0)
