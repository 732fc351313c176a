"""HarmoFL's two halves as settings (Jiang et al., AAAI 2022): amplitude normalization and weight perturbation.

``strategy = "harmofl"`` always uses both; any other strategy can add either
one with ``amplitude-normalization`` / ``weight-perturbation``
(:meth:`fedsm_core.config.RunConfig.harmofl_settings` resolves which run).
"""

from __future__ import annotations

import dataclasses

from fedsm_core.checks import check_settings, setting


@dataclasses.dataclass(frozen=True)
class HarmoFLSettings:
    """The ``amplitude-*`` and ``perturbation-*`` run-config keys.

    Attributes
    ----------
    amplitude_normalization : bool
        Put :class:`~fedsm_core.models.amplitude.AmplitudeNormalization` in
        front of every U-Net (``amplitude-normalization``).
    amplitude_decay : float
        ``v`` of each site's running average amplitude ``A <- (1 - v) A + v |F(x)|``
        (``amplitude-decay``).
    amplitude_window : int
        Half-width of the centred low-frequency window whose amplitude is
        normalized, 0 for the whole spectrum (``amplitude-window``; at most half
        the image size, checked by the run config).
    amplitude_freeze_round : int
        After this round the server averages the sites' amplitudes into one and
        fixes it; 0 never fixes it (``amplitude-freeze-round``).
    weight_perturbation : bool
        HarmoFL's weight perturbation in local training (``weight-perturbation``).
    perturbation_alpha : float
        Its radius ``alpha`` relative to each layer's weight norm (``perturbation-alpha``).
    """

    amplitude_normalization: bool = setting(False, "amplitude-normalization")
    amplitude_decay: float = setting(0.1, "amplitude-decay", low=1e-6, high=1.0)
    amplitude_window: int = setting(0, "amplitude-window", low=0, high=2048, allowed="[0, image-size / 2]")
    amplitude_freeze_round: int = setting(1, "amplitude-freeze-round", low=0, high=100_000)
    weight_perturbation: bool = setting(False, "weight-perturbation")
    perturbation_alpha: float = setting(0.05, "perturbation-alpha", low=0.0, high=100.0)

    def __post_init__(self) -> None:
        check_settings(self)

    @property
    def active_perturbation_alpha(self) -> float:
        """The radius local training uses: ``perturbation-alpha`` with weight perturbation on, else 0 (plain steps)."""
        return self.perturbation_alpha if self.weight_perturbation else 0.0
