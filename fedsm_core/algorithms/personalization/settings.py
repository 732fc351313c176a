"""The personalization method of FedSM's personalized models and its hyper-parameters, checked once.

The method's name is one of the registry's (:data:`~fedsm_core.algorithms.personalization.registry.METHODS`);
each hyper-parameter is read only by its own method.
"""

from __future__ import annotations

import dataclasses

from fedsm_core.algorithms.personalization.registry import METHODS
from fedsm_core.checks import check_settings, setting

PERSONALIZATIONS: tuple[str, ...] = tuple(METHODS)


@dataclasses.dataclass(frozen=True)
class PersonalizationSettings:
    """The ``personalization`` run-config key and the hyper-parameters of each method.

    Attributes
    ----------
    method : str
        ``softpull`` (FedSM's own), ``ft``, ``apfl``, ``ditto``, ``perfedavg`` or
        ``pfedme`` (``personalization``).
    apfl_alpha, apfl_alpha_lr : float
        APFL's initial mixing weight ``alpha`` and the SGD step size of its
        update; ``apfl_alpha_lr = 0`` keeps ``alpha`` fixed.
    ditto_lambda : float
        Ditto's ``lambda`` of ``lambda / 2 * ||v - w||^2``.
    perfedavg_alpha : float
        Per-FedAvg's inner (adaptation) step size ``alpha``.
    perfedavg_steps : int
        Inner gradient steps of Per-FedAvg, in training and for the deployed model.
    pfedme_lambda, pfedme_k, pfedme_eta : float, int, float
        pFedMe's ``lambda``, inner steps ``K`` per minibatch and local step size
        ``eta``; ``eta * lambda <= 1``.
    """

    method: str = setting("softpull", "personalization", choices=PERSONALIZATIONS)
    apfl_alpha: float = setting(0.5, "apfl-alpha", low=0.0, high=1.0)
    apfl_alpha_lr: float = setting(0.01, "apfl-alpha-lr", low=0.0, high=10.0)
    ditto_lambda: float = setting(0.1, "ditto-lambda", low=0.0, high=1e6)
    perfedavg_alpha: float = setting(0.01, "perfedavg-alpha", low=1e-8, high=10.0)
    perfedavg_steps: int = setting(1, "perfedavg-steps", low=1, high=100)
    pfedme_lambda: float = setting(15.0, "pfedme-lambda", low=0.0, high=1e6)
    pfedme_k: int = setting(5, "pfedme-k", low=1, high=100)
    pfedme_eta: float = setting(0.005, "pfedme-eta", low=0.0, high=10.0)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.pfedme_eta * self.pfedme_lambda > 1.0:
            raise ValueError(
                f"pfedme-eta * pfedme-lambda = {self.pfedme_eta} * {self.pfedme_lambda} is above 1: the local model "
                f"w_k <- w_k - eta * lambda * (w_k - theta) would overshoot theta; lower one of them")
