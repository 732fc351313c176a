"""FedSM server state and aggregation (Xu et al., CVPR 2022, Algorithm 1, server side)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from fedsm_core.algorithms.baselines.harmofl import AmplitudeSchedule
from fedsm_core.algorithms.fedsm.selector_head import SelectorStatistics, with_fitted_head
from fedsm_core.algorithms.fedsm.settings import SELECTOR_WEIGHTINGS, FedSMSettings
from fedsm_core.algorithms.fedsm.softpull import check_lam
from fedsm_core.algorithms.personalization.registry import personalization as personalization_method
from fedsm_core.algorithms.robust_aggregation import AggregationSettings, robust_average
from fedsm_core.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerSettings
from fedsm_core.checks import check_choice
from fedsm_core.data.statistics import ChannelStatistics, pool_channel_statistics
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import Weights, check_same_layout, get_weights


@dataclasses.dataclass
class FedSMPayload:
    """What one client receives for a round of Algorithm 1.

    Only its own personalized model travels, not the other sites' ones.
    ``selector_optimizer`` holds the averaged Adam moments (empty before round 1).
    """

    global_weights: Weights
    personal_weights: Weights
    selector_weights: Weights
    selector_optimizer: Weights


@dataclasses.dataclass
class FedSMUpdate:
    """What one client returns after its local epochs."""

    global_weights: Weights
    personal_weights: Weights
    selector_weights: Weights
    selector_optimizer: Weights
    num_examples: int
    client_state: Weights = dataclasses.field(default_factory=dict)
    """What the site keeps for its next round (APFL's ``v_k`` and ``alpha_k``); never sent."""
    steps: float = float("nan")
    """The local steps the site took (its ``steps`` metric), for ``step-normalization``."""
    optimizer_state: Weights | None = None
    """The site's Adam states under ``optimizer-state = local``, kept at the site; never sent."""


def _copy(weights: Mapping[str, np.ndarray]) -> Weights:
    return {key: np.array(value, copy=True) for key, value in weights.items()}


class FedSM:
    """Keeps the super model on the server and aggregates one round at a time.

    After each round (Algorithm 1):

    * global model: ``w <- sum_k (n_k / n) w_k`` over the replies, or the
      server optimizer's step from it (``server-optimizer``, ``step-normalization``:
      :mod:`fedsm_core.algorithms.server_optimizer`);
    * selector and its Adam moments: averaged (equally by default, see
      ``selector_weighting``), so every client starts the
      next round from one shared optimizer state (a client only ever sees its
      own label, and without shared moments each pulls the selector its way);
    * personalized models: SoftPull with coefficient ``lam`` over all K sites,
      ``w_p,k <- lam w_p,k + (1 - lam)/(K - 1) sum_{k' != k} w_p,k'``; a site
      that did not reply (failed, timed out or was rejected) keeps its
      personalized model unchanged, and that model is its input to the
      other sites' SoftPull. With another ``personalization`` method the
      personalized models are local: each reply is kept as it is
      (:mod:`fedsm_core.algorithms.personalization.registry`).

    Parameters
    ----------
    site_names : sequence of str
        The K training sites, in selector-output order.
    global_weights : dict
        Initial U-Net weights; every personalized model starts from a copy.
    selector_weights : dict
        Initial selector weights.
    lam : float
        SoftPull coefficient, ``1/K <= lam <= 1``.
    selector_weighting : {"equal", "size"}
        How the selector and its moments are averaged: every site alike
        (default), or by ``n_k / n`` like the global model. The selector's
        classes are the sites, so size weighting teaches it the large sites'
        prior; equal weighting treats every site as equally likely.
    personalization : str
        How personalized models are trained and folded in: ``softpull``
        (FedSM's own, default) or a method that keeps them local (``ft``,
        ``apfl``, ``ditto``, ``perfedavg``, ``pfedme``); ``lam`` is then checked
        but unused.
    server_optimizer : ServerOptimizerSettings, optional
        How the global model moves toward the sites' average; plain averaging when omitted.
    aggregation : AggregationSettings, optional
        How the global model, the selector and its moments, and SoftPull's pull
        average the sites (:mod:`fedsm_core.algorithms.robust_aggregation`); the mean when omitted.
    """

    def __init__(
        self,
        site_names: Sequence[str],
        global_weights: Weights,
        selector_weights: Weights,
        lam: float,
        selector_weighting: str = "equal",
        personalization: str = "softpull",
        server_optimizer: ServerOptimizerSettings | None = None,
        aggregation: AggregationSettings | None = None,
    ) -> None:
        check_choice("selector-weighting", selector_weighting, SELECTOR_WEIGHTINGS)
        self.selector_weighting = selector_weighting
        if len(set(site_names)) != len(site_names) or not site_names:
            raise ValueError(f"FedSM needs distinct, non-empty site names, got {list(site_names)}")
        check_lam(lam, len(site_names))
        self.personalization = personalization
        self.personal_update = personalization_method(personalization).server_update
        self.site_names = list(site_names)
        self.lam = float(lam)
        self.global_weights = _copy(global_weights)
        self.personalized = {site: _copy(global_weights) for site in self.site_names}
        self.selector_weights = _copy(selector_weights)
        self.selector_optimizer: Weights = {}
        self.aggregation = aggregation or AggregationSettings()
        self.global_optimizer = ServerOptimizer(server_optimizer or ServerOptimizerSettings(), self.aggregation)

    def payload_for(self, site: str) -> FedSMPayload:
        """The models site ``site`` needs for one round of local training."""
        if site not in self.personalized:
            raise KeyError(f"unknown site '{site}'; known sites: {self.site_names}")
        return FedSMPayload(self.global_weights, self.personalized[site], self.selector_weights,
                            self.selector_optimizer)

    def aggregate(self, updates: Mapping[str, FedSMUpdate], server_round: int = 1) -> None:
        """Fold round ``server_round``'s client updates into the super model."""
        if not updates:
            raise ValueError("FedSM.aggregate: no client updates in this round")
        unknown = sorted(set(updates) - set(self.personalized))
        if unknown:
            raise KeyError(f"updates from unknown sites {unknown}; known sites: {self.site_names}")
        for site, update in updates.items():
            self._check_update(site, update)
        replies = list(updates.values())
        sizes = [update.num_examples for update in replies]
        # Everything is computed before anything is assigned, so a failure leaves the state intact.
        global_weights = self.global_optimizer.aggregate(self.global_weights, [u.global_weights for u in replies],
                                                         sizes, [u.steps for u in replies], server_round,
                                                         list(updates))
        selector_sizes = sizes if self.selector_weighting == "size" else [1.0] * len(replies)
        selector_weights = robust_average([u.selector_weights for u in replies], selector_sizes, self.aggregation)
        selector_optimizer = self.selector_optimizer
        if all(u.selector_optimizer for u in replies):
            selector_optimizer = robust_average([u.selector_optimizer for u in replies], selector_sizes,
                                                self.aggregation)
        personalized = {**self.personalized, **{site: u.personal_weights for site, u in updates.items()}}
        pulled = self.personal_update(personalized, self.lam, self.aggregation)
        self.personalized = {site: pulled[site] if site in updates else self.personalized[site]
                             for site in self.site_names}
        self.global_weights, self.selector_weights = global_weights, selector_weights
        self.selector_optimizer = selector_optimizer

    def fix_amplitude(self, schedule: AmplitudeSchedule, updates: Sequence[FedSMUpdate]) -> None:
        """HarmoFL's freeze round: the sites' average amplitude fixed into the global and every personalized model.

        ``updates`` are this round's replies, whose global models hold each
        site's running amplitude average (:mod:`fedsm_core.algorithms.baselines.harmofl`).
        """
        models = {"": self.global_weights, **self.personalized}
        fixed = schedule.fix([u.global_weights for u in updates], [u.num_examples for u in updates], models)
        self.global_weights = fixed.pop("")
        self.personalized = fixed

    def fit_selector_head(self, statistics: Mapping[str, SelectorStatistics], shrinkage: float) -> list[str]:
        """Replace the selector's linear head by the one fitted from the sites' embedding statistics.

        See :mod:`fedsm_core.algorithms.fedsm.selector_head`. Each site is one
        class of the fit; a site missing from ``statistics`` (no reply, or a
        reply the server rejected) gets a closed route: no image goes to its
        personalized model until its statistics are accepted again. The fit
        needs two sites; with fewer the state is unchanged (``ValueError``).

        Returns
        -------
        list of str
            The sites whose routes are closed.
        """
        present = [site for site in self.site_names if site in statistics]
        if len(present) < 2:
            raise ValueError(f"selector head: statistics from {present} only; the fit needs two or more sites")
        self.selector_weights = with_fitted_head(self.selector_weights, [statistics.get(s) for s in self.site_names],
                                                 shrinkage)
        return [site for site in self.site_names if site not in statistics]

    def _check_update(self, site: str, update: FedSMUpdate) -> None:
        """Raise ``ValueError`` when a reply does not match the server's models."""
        check_same_layout(self.global_weights, update.global_weights, f"global model from {site}")
        check_same_layout(self.global_weights, update.personal_weights, f"personalized model from {site}")
        check_same_layout(self.selector_weights, update.selector_weights, f"selector from {site}")
        if update.num_examples <= 0:
            raise ValueError(f"reply of {site} reports {update.num_examples} training examples; expected > 0")


def initial_fedsm(
    spec: ModelSpec,
    site_names: Sequence[str],
    site_pixels: Sequence[ChannelStatistics],
    *,
    seed: int,
    settings: FedSMSettings,
    personalization: str = "softpull",
    server_optimizer: ServerOptimizerSettings | None = None,
    aggregation: AggregationSettings | None = None,
    extra_selector_spec: ModelSpec | None = None,
) -> tuple[FedSM, Weights | None]:
    """The start state of a FedSM run: the one builder the ServerApp and the in-process loop share.

    The U-Net is drawn under ``torch.manual_seed(seed)``, then the selector,
    whose input is normalised by the training sites' pooled pixel statistics
    (sizes and per-channel sums each site reported, no images). The global
    model and every personalized model start from the same U-Net.

    Parameters
    ----------
    seed : int
        The run's ``seed``.
    settings : FedSMSettings
        SoftPull's ``lambda`` and the selector's weighting.
    personalization : str
        The personalization method's name.
    server_optimizer : ServerOptimizerSettings, optional
        How the global model moves toward the sites' average; plain averaging when omitted.
    aggregation : AggregationSettings, optional
        How the global model, the selector and SoftPull's pull average the sites; the mean when omitted.
    extra_selector_spec : ModelSpec, optional
        FedSM-extra: the spec of its ``K + 1``-output selector, drawn (and
        normalised) right after the U-Net and returned as the second value;
        FedSM's own selector, drawn after it, stays untrained.

    Returns
    -------
    (FedSM, extra selector weights or None)
    """
    torch.manual_seed(seed)
    model = spec.build_segmentation()
    pixels = pool_channel_statistics(list(site_pixels))
    extra = None
    if extra_selector_spec is not None:
        extra_selector = extra_selector_spec.build_selector()
        extra_selector.set_input_statistics(pixels.mean, pixels.std)
        extra = get_weights(extra_selector)
    selector = spec.build_selector()
    if extra_selector_spec is None:
        selector.set_input_statistics(pixels.mean, pixels.std)
    fedsm = FedSM(site_names, get_weights(model), get_weights(selector), settings.softpull_lambda,
                  settings.selector_weighting, personalization, server_optimizer, aggregation)
    return fedsm, extra
