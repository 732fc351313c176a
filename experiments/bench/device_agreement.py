"""One FedSM round on two devices from the same seeds, and how far the resulting weights are apart.

Both runs go through :mod:`experiments.in_process` (the app's core functions
without Flower): the same data, the same initial super model, the same
per-(round, site) seeds, in float32 with TF32 off and deterministic cuDNN.
What can still differ is the order of floating-point sums inside kernels, so
the round's updates ``delta = w_after - w_before`` must agree closely, not
bit for bit.

Tolerance: for every model (global, each personalized model, selector),
``||delta_b - delta_a||_2 <= tolerance * ||delta_a||_2`` with
``tolerance = max(RELATIVE_TOLERANCE, FLOOR_FACTOR * floor)``, where ``floor``
is measured in the same check: the largest relative difference between two
CPU rounds that differ only in torch's thread count (1 against all cores),
i.e. in the order of floating-point sums and nothing else.

Why a measured floor and not a fixed 1 %: Adam's first step is
``lr * m / (sqrt(v) + eps) ~ lr * sign(g)``, so every coordinate whose gradient
is near zero flips between ``+lr`` and ``-lr`` when its sum is taken in another
order, and the later steps and SoftPull's mixing carry the flips on. Measured
on the CPU alone (1 against 2 threads, 64 px, four local steps): up to 7.3 %
relative for one personalized model; with one local step at most 2.1 %. A fixed
1 % thus fails correct code, as the first GPU run of this check did. One local
step keeps the floor low enough to separate real bugs: a 10 % larger learning
rate (a stand-in for a lost hook or a wrong scale) moves every model by 10-17 %
on the same round, several times the floor.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from experiments.in_process import prepare, train_round
from fedsm_core.config import RunConfig
from fedsm_core.models.weights import Weights

RELATIVE_TOLERANCE = 1e-2
FLOOR_FACTOR = 2.0  # a GPU sums in other orders than either CPU run (tree reductions, other conv algorithms)
# Small and quick on the CPU: 6 sites, one minibatch each, three models stepped on each.
ROUND_SETTINGS = {"image-size": 64, "data-scale": 0.25, "max-local-steps": 1, "num-server-rounds": 1,
                  "precision": "fp32", "deterministic": True, "torch-threads": 0}


@dataclasses.dataclass(frozen=True)
class ModelAgreement:
    """How one model's round update on device B compares with device A's."""

    model: str
    update_norm: float
    difference_norm: float
    max_abs_difference: float
    tolerance: float = RELATIVE_TOLERANCE

    @property
    def relative(self) -> float:
        """``||delta_b - delta_a|| / ||delta_a||`` (0 when neither moved)."""
        if self.update_norm == 0.0:
            return 0.0 if self.difference_norm == 0.0 else float("inf")
        return self.difference_norm / self.update_norm

    @property
    def agrees(self) -> bool:
        """Within :attr:`tolerance`."""
        return self.relative <= self.tolerance


def compare_updates(model: str, before: Weights, after_a: Weights, after_b: Weights) -> ModelAgreement:
    """Compare the updates ``after - before`` of two runs over the floating-point arrays, in float64.

    Raises
    ------
    ValueError
        When the three weight sets do not hold the same names.
    """
    if not set(before) == set(after_a) == set(after_b):
        raise ValueError(f"{model}: the weights of the two runs hold different arrays "
                         f"({sorted(set(after_a) ^ set(after_b))})")
    update_sq = difference_sq = 0.0
    max_abs = 0.0
    for name, start in before.items():
        if np.asarray(start).dtype.kind != "f":
            continue  # step counters of batch normalization
        start64 = np.asarray(start, dtype=np.float64)
        delta_a = np.asarray(after_a[name], dtype=np.float64) - start64
        delta_b = np.asarray(after_b[name], dtype=np.float64) - start64
        update_sq += float(np.sum(delta_a**2))
        difference_sq += float(np.sum((delta_b - delta_a) ** 2))
        max_abs = max(max_abs, float(np.max(np.abs(delta_b - delta_a), initial=0.0)))
    return ModelAgreement(model, update_sq**0.5, difference_sq**0.5, max_abs)


def fedsm_models(federation) -> dict[str, Weights]:
    """The server's models after aggregation: global, each personalized model, selector."""
    fedsm = federation.fedsm
    models = {"global": fedsm.global_weights, "selector": fedsm.selector_weights}
    models.update({f"personalized {site}": fedsm.personalized[site] for site in fedsm.site_names})
    return {name: {key: np.array(value, copy=True) for key, value in weights.items()}
            for name, weights in models.items()}


def one_round(device: str, settings: dict[str, object]) -> tuple[dict[str, Weights], dict[str, Weights]]:
    """Models before and after one FedSM round on ``device``, from the seeds of ``settings``."""
    config = RunConfig.from_mapping({**ROUND_SETTINGS, **settings, "device": device})
    federation = prepare(config)  # also sets the CUDA switches: deterministic cuDNN, no TF32
    before = fedsm_models(federation)
    train_round(federation, 1)
    return before, fedsm_models(federation)


def compare_devices(device_a: str = "cpu", device_b: str = "cuda", settings: dict[str, object] | None = None,
                    settings_b: dict[str, object] | None = None, tolerance: float = RELATIVE_TOLERANCE,
                    ) -> list[ModelAgreement]:
    """One round on each device from the same seeds; one :class:`ModelAgreement` per model.

    ``settings_b`` (default: ``settings``) lets the second run differ in
    settings that must not change the result beyond rounding (thread count).
    """
    settings = settings or {}
    before, after_a = one_round(device_a, settings)
    before_b, after_b = one_round(device_b, settings if settings_b is None else {**settings, **settings_b})
    for name, weights in before.items():  # the same start, or the comparison means nothing
        if any(not np.array_equal(weights[key], before_b[name][key]) for key in weights):
            raise RuntimeError(f"{name} starts from different weights on {device_a} and {device_b}")
    return [dataclasses.replace(compare_updates(name, before[name], after_a[name], after_b[name]), tolerance=tolerance)
            for name in before]


def summation_order_floor(settings: dict[str, object] | None = None) -> float:
    """Largest relative update difference between CPU rounds on 1 thread and on all cores.

    The two runs differ only in how torch splits its sums across threads, so
    this is what rounding alone does to the round on these settings.
    """
    all_cores = max(2, os.cpu_count() or 2)  # explicit: torch-threads = 0 would keep the count set before
    models = compare_devices("cpu", "cpu", {**(settings or {}), "torch-threads": 1}, {"torch-threads": all_cores})
    return max(m.relative for m in models)


def tolerance_for(floor: float) -> float:
    """The agreement tolerance given the measured summation-order ``floor``."""
    return max(RELATIVE_TOLERANCE, FLOOR_FACTOR * floor)
