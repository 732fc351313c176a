"""FedSM's own run-config keys (Xu et al., CVPR 2022): SoftPull's lambda, the model selector, and gamma.

The personalization method (SoftPull or another) has its own settings
(:mod:`fedsm_core.algorithms.personalization.settings`); these are the rest of
FedSM's super model: how the selector trains and is averaged, and how the
super model routes with gamma.
"""

from __future__ import annotations

import dataclasses

from fedsm_core.algorithms.server_optimizer import SITE_WEIGHTINGS
from fedsm_core.checks import check_settings, setting

SELECTOR_WEIGHTINGS = SITE_WEIGHTINGS  # "equal" or "size", as site-weighting
SELECTOR_MOMENTS = ("averaged", "local")  # the selector's Adam moments: averaged by the server, or kept at each site
SELECTOR_HEADS = ("fitted", "trained")  # see fedsm_core.algorithms.fedsm.selector_head
GAMMA_SELECTIONS = ("per-model", "validation", "client-average", "fixed")  # see fedsm_core.algorithms.fedsm.gamma
ROUTE_BY = ("image", "case")  # see fedsm_core.algorithms.fedsm.super_model.selector_probabilities
FINE_TUNE_GAMMAS = ("cross-fit", "validation")  # see fedsm_core.evaluation.cross_fit


@dataclasses.dataclass(frozen=True)
class FedSMSettings:
    """SoftPull's ``lambda``, the selector's training and averaging, gamma, and FedSM-extra's selector rounds.

    Attributes
    ----------
    softpull_lambda : float
        SoftPull's ``lambda`` of ``w_k <- lambda w_k + (1 - lambda) / (K - 1) sum_{k' != k} w_k'``
        (Algorithm 1; ``softpull-lambda``); at least ``1 / K``, which
        :func:`~fedsm_core.algorithms.fedsm.softpull.check_lam` checks once ``K`` is known.
    selector_lr : float
        The selector's Adam learning rate (``selector-lr``).
    selector_width : int
        Base width of the selector (``selector-width``).
    selector_negatives : bool
        Also train the selector on restyled copies labelled "any other site"
        (``selector-negatives``).
    selector_weighting : str
        Average the selector per site (``equal``) or by ``n_k / n`` (``size``).
    selector_moments : str
        The selector's Adam moments kept at each site (``local``) or averaged
        by the server (``averaged``).
    selector_head : str
        ``fitted`` from the sites' embedding statistics before every
        evaluation, or ``trained`` as the rest of the selector.
    selector_shrinkage : float
        Shrinkage of the fitted head's pooled covariance toward its diagonal.
    gamma : float
        The super model's confidence threshold: the selector's top probability
        at most ``gamma`` routes to the global model (``gamma``).
    gamma_selection : str
        ``per-model``, ``validation``, ``client-average`` or ``fixed`` (``gamma-selection``).
    extra_rounds : int
        FedSM-extra: selector rounds after the model rounds (``extra-rounds``).
    route_by : str
        ``image``: Algorithm 2 routes every image alone (the paper); ``case``:
        once per case from the mean of its slices' selector log-probabilities,
        the route applying to every slice of the case (``route-by``).
    fine_tune_passes : int
        0: the personalized models are the ones the rounds trained (the paper).
        ``E > 0`` (default 30, chosen on validation): after the last round
        (also one the stopping rule ended on) every site fine-tunes the final
        global model for up to ``E`` passes and keeps the pass best on its
        validation split as its personalized model
        (:mod:`fedsm_core.algorithms.fedsm.final_fine_tuning`; ``fine-tune-passes``).
        Read by strategy ``fedsm`` only; the others have no personalized
        models to replace (FedSM-extra's selector rounds come after its model
        rounds) and ignore it.
    fine_tune_gamma : str
        After fine-tuning, how a site scores its own validation images for the
        gamma choice: ``cross-fit`` (default), each half of its split (by case)
        with the pass best on the other half; ``validation``, with the kept
        model, whose pass those images chose
        (:mod:`fedsm_core.evaluation.cross_fit`; ``fine-tune-gamma``).
    """

    softpull_lambda: float = setting(0.99, "softpull-lambda", low=0.0, high=1.0, allowed="[1/K, 1]")
    selector_lr: float = setting(1e-3, "selector-lr", low=1e-8, high=10.0)
    selector_width: int = setting(32, "selector-width", low=1, high=512)
    selector_negatives: bool = setting(True, "selector-negatives")
    selector_weighting: str = setting("equal", "selector-weighting", choices=SELECTOR_WEIGHTINGS)
    selector_moments: str = setting("local", "selector-moments", choices=SELECTOR_MOMENTS)
    selector_head: str = setting("fitted", "selector-head", choices=SELECTOR_HEADS)
    selector_shrinkage: float = setting(0.1, "selector-shrinkage", low=0.0, high=1.0)
    gamma: float = setting(0.5, "gamma", low=0.0, high=1.0)
    gamma_selection: str = setting("client-average", "gamma-selection", choices=GAMMA_SELECTIONS)
    extra_rounds: int = setting(10, "extra-rounds", low=1, high=100_000)
    route_by: str = setting("image", "route-by", choices=ROUTE_BY)
    fine_tune_passes: int = setting(30, "fine-tune-passes", low=0, high=10_000)
    fine_tune_gamma: str = setting("cross-fit", "fine-tune-gamma", choices=FINE_TUNE_GAMMAS)

    def __post_init__(self) -> None:
        check_settings(self)
