"""The personalization methods of FedSM by run-config name, client and server side.

Each method names the learner its sites train (``start``) and how the server
folds the returned personalized models in (``server_update``): FedSM's
SoftPull mixes them across sites (Eq. 4 of Xu et al.); FT, APFL, Ditto,
Per-FedAvg and pFedMe keep each site's reply as it is, since their
personalized models are local by design. ``softpull-lambda`` only matters
for ``softpull``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from fedsm_core.algorithms.personalization.apfl import start_apfl
from fedsm_core.algorithms.personalization.base import (
    PersonalStart,
    PersonalTrainer,
    start_fine_tuning,
    start_softpull,
)
from fedsm_core.algorithms.personalization.ditto import start_ditto
from fedsm_core.algorithms.personalization.perfedavg import start_perfedavg
from fedsm_core.algorithms.personalization.pfedme import start_pfedme
from fedsm_core.algorithms.robust_aggregation import AggregationSettings, robust_soft_pull
from fedsm_core.models.weights import Weights

ServerUpdate = Callable[[Mapping[str, Mapping[str, np.ndarray]], float, AggregationSettings], dict[str, Weights]]


def keep_replies(personalized: Mapping[str, Mapping[str, np.ndarray]], lam: float,
                 aggregation: AggregationSettings | None = None) -> dict[str, Weights]:
    """Every site's personalized model as it is (copied); ``lam`` and ``aggregation`` are not used."""
    return {site: {key: np.array(value, copy=True) for key, value in weights.items()}
            for site, weights in personalized.items()}


@dataclasses.dataclass(frozen=True)
class Personalization:
    """One personalization method: its site learner, its server update, and whether it takes the loop's plain step.

    A method with ``plain_step`` trains with the local loop's ordinary optimizer
    step, so hooks on that step (HarmoFL's weight perturbation) compose with
    it; APFL, Per-FedAvg and pFedMe take steps of their own and are trained without.
    """

    name: str
    start: Callable[[PersonalStart], PersonalTrainer]
    server_update: ServerUpdate
    plain_step: bool = False


METHODS: dict[str, Personalization] = {
    method.name: method
    for method in (
        Personalization("softpull", start_softpull, robust_soft_pull, plain_step=True),
        Personalization("ft", start_fine_tuning, keep_replies, plain_step=True),
        Personalization("apfl", start_apfl, keep_replies),
        Personalization("ditto", start_ditto, keep_replies, plain_step=True),
        Personalization("perfedavg", start_perfedavg, keep_replies),
        Personalization("pfedme", start_pfedme, keep_replies),
    )
}


def personalization(name: str) -> Personalization:
    """The method called ``name``; ``ValueError`` lists the valid names otherwise."""
    if name not in METHODS:
        raise ValueError(f"personalization = '{name}' is not one of {list(METHODS)}; set it in "
                         "[tool.flwr.app.config] or with --run-config")
    return METHODS[name]
