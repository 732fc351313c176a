"""HarmoFL's server side (Jiang et al., AAAI 2022): one global amplitude, then fixed.

Each site's models carry the running average amplitude of its images
(:class:`~fedsm_core.models.amplitude.AmplitudeNormalization`, stored under
``amplitude_norm.*`` in the weights). After round ``freeze_round`` the server
averages the sites' amplitudes into a global one,

    A = sum_k (n_k / n) * A_k / (1 - (1 - v)^{t_k})

(each bias-corrected for its ``t_k`` batches, see
:func:`~fedsm_core.models.amplitude.bias_corrected`), writes it into every
model it keeps and marks it fixed; from then on every site normalizes its
images to the same amplitude. Only these averages leave a site, never an
image. Before the freeze round the amplitude entries are averaged like any
other weight, so each site continues from the federation's average.

Weight perturbation, HarmoFL's second half, lives on the client
(:class:`~fedsm_core.training.weight_perturbation.WeightPerturbation`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from fedsm_core.algorithms.robust_aggregation import AggregationSettings, robust_average
from fedsm_core.models.weights import Weights

LAYER = "amplitude_norm."
AMPLITUDE, FROZEN, BATCHES = LAYER + "amplitude", LAYER + "frozen", LAYER + "batches"


def has_amplitude(weights: Mapping[str, np.ndarray]) -> bool:
    """Whether the weights belong to a model with amplitude normalization."""
    return AMPLITUDE in weights


def corrected_amplitude(weights: Mapping[str, np.ndarray], decay: float) -> np.ndarray:
    """The amplitude a site's model normalizes with: fixed, or its bias-corrected running average."""
    amplitude = np.asarray(weights[AMPLITUDE], dtype=np.float64)
    batches = int(np.asarray(weights[BATCHES]))
    if int(np.asarray(weights[FROZEN])) or batches <= 0:
        return amplitude
    return amplitude / (1.0 - (1.0 - decay) ** batches)


def global_amplitude(site_weights: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float],
                     decay: float) -> np.ndarray:
    """``sum_k (n_k / n) A_k`` over the sites' bias-corrected amplitudes (float64)."""
    if not site_weights or len(site_weights) != len(sizes):
        raise ValueError(f"global_amplitude: {len(site_weights)} weight sets for {len(sizes)} sizes")
    total = float(sum(sizes))
    if total <= 0:
        raise ValueError(f"global_amplitude: sizes must have a positive sum, got {list(sizes)}")
    missing = [i for i, w in enumerate(site_weights) if not has_amplitude(w)]
    if missing:
        raise ValueError(f"global_amplitude: weight sets {missing} have no '{AMPLITUDE}'; "
                         "was the model built with amplitude normalization?")
    return sum((n / total) * corrected_amplitude(w, decay) for w, n in zip(site_weights, sizes, strict=True))


def with_fixed_amplitude(weights: Mapping[str, np.ndarray], amplitude: np.ndarray) -> Weights:
    """A copy of ``weights`` that normalizes with ``amplitude`` from now on, without updating it."""
    reference = np.asarray(weights[AMPLITUDE])
    if reference.shape != np.shape(amplitude):
        raise ValueError(f"amplitude has shape {np.shape(amplitude)}, the model's is {reference.shape}")
    fixed = dict(weights)
    fixed[AMPLITUDE] = np.asarray(amplitude, dtype=reference.dtype).copy()
    fixed[FROZEN] = np.ones_like(np.asarray(weights[FROZEN]))
    return fixed


@dataclasses.dataclass(frozen=True)
class AmplitudeSchedule:
    """When the server fixes the global amplitude.

    Attributes
    ----------
    freeze_round : int
        The round after which the amplitude is averaged and fixed (the
        paper: 1); 0 never fixes it (it is then averaged every round).
    decay : float
        ``v`` of the sites' running averages, for the bias correction.
    """

    freeze_round: int = 1
    decay: float = 0.1
    aggregation: AggregationSettings = AggregationSettings()

    def due(self, server_round: int) -> bool:
        """Whether the amplitude is fixed at the end of ``server_round``."""
        return self.freeze_round > 0 and server_round == self.freeze_round

    def fix(self, site_weights: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float],
            models: Mapping[str, Weights]) -> dict[str, Weights]:
        """``models`` with the global amplitude of ``site_weights`` written in and fixed."""
        if self.aggregation.name == "mean":
            amplitude = global_amplitude(site_weights, sizes, self.decay)
        else:  # a robust statistic of the sites' bias-corrected amplitudes; sizes are what an attacker claims
            corrected = [{AMPLITUDE: corrected_amplitude(w, self.decay)} for w in site_weights]
            amplitude = robust_average(corrected, sizes, self.aggregation)[AMPLITUDE]
        return {name: with_fixed_amplitude(weights, amplitude) for name, weights in models.items()}
