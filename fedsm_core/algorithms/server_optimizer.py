"""Server optimizers: the step the server takes from the current model toward the clients' average.

FedAvg replaces the model by the weighted average of the sites' models. The
server optimizers of Hsu et al. 2019 (FedAvgM) and Reddi et al. 2021 (FedAdam,
FedYogi) treat ``Delta_t = avg_t - w_t`` as a pseudo-gradient step and take
their own step along it, with a server learning rate and moments kept across
rounds. Written once on weight dictionaries (numpy, float64), so every shared
model can use it; the formulas are those of Flower's ``FedAvgM``, ``FedAdam``
and ``FedYogi`` (``flwr.serverapp.strategy``), which the tests check against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from fedsm_core.algorithms.aggregation import normalized_average
from fedsm_core.algorithms.filter_memory import MEMORY_KEY, FilterMemory
from fedsm_core.algorithms.filtered_mean import FilterDecision, filter_replies
from fedsm_core.algorithms.robust_aggregation import AggregationSettings, robust_average
from fedsm_core.algorithms.update_clipping import clip_updates
from fedsm_core.checks import check_settings, setting
from fedsm_core.models.weights import Weights, check_same_layout

SERVER_OPTIMIZERS = ("none", "momentum", "adam", "yogi")
STEP_NORMALIZATIONS = ("none", "fednova")
SITE_WEIGHTINGS = ("size", "equal")  # the words of selector-weighting too


@dataclasses.dataclass(frozen=True)
class ServerOptimizerSettings:
    """The ``server-*`` run-config keys.

    Attributes
    ----------
    name : str
        ``none`` (FedAvg: the average is the new model), ``momentum``
        (FedAvgM), ``adam`` (FedAdam) or ``yogi`` (FedYogi).
    lr : float
        The server learning rate ``eta`` (``server-lr``).
    momentum : float
        FedAvgM's momentum ``beta`` (``server-momentum``).
    beta_1, beta_2, tau : float
        FedAdam's and FedYogi's moment decays and adaptivity ``tau``
        (``server-beta1``, ``server-beta2``, ``server-tau``).
    step_normalization : str
        ``none`` (average by size) or ``fednova`` (each site's update divided by
        its local steps first: :func:`~fedsm_core.algorithms.aggregation.normalized_average`).
    site_weighting : str
        How much each site counts in the average (``site-weighting``): ``size``
        (``p_k = n_k / n``, FedAvg) or ``equal`` (``p_k = 1 / K``, so a site of
        12 images counts as much as one of 100, as the client average of the
        test Dice counts them).
    """

    name: str = setting("none", "server-optimizer", choices=SERVER_OPTIMIZERS)
    lr: float = setting(1.0, "server-lr", low=1e-8, high=100.0)
    momentum: float = setting(0.0, "server-momentum", low=0.0, high=1.0)
    beta_1: float = setting(0.9, "server-beta1", low=0.0, high=1.0)
    beta_2: float = setting(0.99, "server-beta2", low=0.0, high=1.0)
    tau: float = setting(1e-3, "server-tau", low=1e-12, high=10.0)
    step_normalization: str = setting("none", "step-normalization", choices=STEP_NORMALIZATIONS)
    site_weighting: str = setting("size", "site-weighting", choices=SITE_WEIGHTINGS)

    def __post_init__(self) -> None:
        check_settings(self)


class ServerOptimizer:
    """One shared model's server optimizer, with its moments kept across rounds.

    Integer arrays (batch-norm counters) take the average unchanged: they are
    counts, not parameters.
    """

    def __init__(self, settings: ServerOptimizerSettings, aggregation: AggregationSettings | None = None) -> None:
        self.settings = settings
        self.aggregation = aggregation or AggregationSettings()
        self.moments: dict[str, Weights] = {}
        self.left_out: list[int] = []  # replies the last aggregate left out (filtered-mean), in reply order
        self.scores: list[tuple[float, float]] = []  # the last filtered mean's (distance ratio, cosine) per reply
        self.memory = FilterMemory()  # each site's distance ratios so far (filter-memory)

    def aggregate(self, current: Mapping[str, np.ndarray], weights: Sequence[Mapping[str, np.ndarray]],
                  sizes: Sequence[float], steps: Sequence[float], server_round: int,
                  sites: Sequence[str] | None = None) -> Weights:
        """The new model from the sites' trained ``weights``: their average (by size, or FedNova's), then :meth:`step`.

        ``steps`` are the local steps each site took (used by ``fednova`` only);
        ``sizes`` are replaced by ones under ``site-weighting = equal``. The
        average is the ``aggregation``'s (:func:`~fedsm_core.algorithms.robust_aggregation.robust_average`):
        the weighted mean, or a statistic one site cannot drag; with
        ``clip-update-norm`` each site's update is first cut to a typical length.
        ``sites`` name the replies, for ``filter-memory`` (which needs them).
        """
        if self.settings.site_weighting == "equal":
            sizes = [1.0] * len(weights)
        if self.aggregation.clip_update_norm:
            weights = clip_updates(current, weights, self.aggregation.clip_update_norm)
        self.left_out, self.scores = [], []
        if self.settings.step_normalization == "fednova":
            averaged = normalized_average(current, weights, sizes, steps)
        elif self.aggregation.name == "filtered-mean":
            averaged = self._filtered(current, weights, sizes, sites)
        else:
            averaged = robust_average(weights, sizes, self.aggregation)
        return self.step(current, averaged, server_round)

    def _filtered(self, current: Mapping[str, np.ndarray], weights: Sequence[Mapping[str, np.ndarray]],
                  sizes: Sequence[float], sites: Sequence[str] | None) -> Weights:
        """The filtered mean, its direction bound measured from ``current``; notes what it left out, and why.

        Under ``filter-memory`` the sites' mean distance ratios, this round's
        included, also leave out a site that stands out on average.
        """
        factor = self.aggregation.filter_factor
        decision = filter_replies(weights, factor, current, self.aggregation.filter_min_cosine)
        if self.aggregation.filter_memory:
            if sites is None:
                raise ValueError("filter-memory: the filtered mean needs the replies' site names")
            decision = self._remembered(decision, sites, factor)
        self.left_out, self.scores = decision.left_out, decision.scores
        return decision.mean(weights, sizes)

    def _remembered(self, decision: FilterDecision, sites: Sequence[str], factor: float) -> FilterDecision:
        """``decision`` with the sites far on average left out too (:mod:`~fedsm_core.algorithms.filter_memory`).

        A round whose median distance is 0 (more than half the replies
        identical) has no finite ratios and is not remembered; where the memory
        would leave out every reply, the round's own decision stands.
        """
        ratios = [ratio for ratio, _ in decision.scores]
        if all(np.isfinite(ratios)):
            self.memory.record(sites, ratios)
        keep = decision.keep & ~self.memory.far(sites, factor)
        return dataclasses.replace(decision, keep=keep) if keep.any() else decision

    def far_sites(self, sites: Sequence[str]) -> list[str]:
        """Those of ``sites`` the filter memory leaves out of every round now (``filter-memory``; else none).

        A site whose mean distance ratio exceeds ``filter-factor`` is out of
        this model's average until its mean falls back under it: the strategy
        may distrust it elsewhere too (FedSM closes its route).
        """
        if self.aggregation.name != "filtered-mean" or not self.aggregation.filter_memory:
            return []
        far = self.memory.far(sites, self.aggregation.filter_factor)
        return [site for site, is_far in zip(sites, far, strict=True) if is_far]

    def average(self, weights: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float]) -> Weights:
        """The plain average of ``weights`` by ``sizes`` or equally (``site-weighting``), without a step.

        For what travels beside a model and is averaged as it is, such as the
        sites' Adam states under ``optimizer-state = averaged``.
        """
        sizes = [1.0] * len(weights) if self.settings.site_weighting == "equal" else sizes
        return robust_average(weights, sizes, self.aggregation)

    def step(self, current: Mapping[str, np.ndarray], averaged: Mapping[str, np.ndarray], server_round: int) -> Weights:
        """The new model from the current one and the sites' weighted average.

        With ``Delta = avg - w`` (float64, per array):

        - ``none``: ``w <- avg``;
        - ``momentum``: ``m <- Delta'`` in round 1, then ``m <- beta m + Delta'``
          with ``Delta' = w - avg``; ``w <- w - eta m``;
        - ``adam``: ``m <- b1 m + (1 - b1) Delta``, ``v <- b2 v + (1 - b2) Delta^2``,
          ``w <- w + eta_t m / (sqrt(v) + tau)`` with
          ``eta_t = eta sqrt(1 - b2^(t+1)) / (1 - b1^(t+1))`` (Flower's bias correction);
        - ``yogi``: as ``adam`` with ``v <- v - (1 - b2) Delta^2 sign(v - Delta^2)`` and ``eta_t = eta``.

        Moments start at zero (FedAvgM's at its first pseudo-gradient).
        ``lr = 1`` and ``momentum = 0`` reduce ``momentum`` to ``none``.
        """
        check_same_layout(current, averaged, "the sites' average")
        if self.settings.name == "none":
            return dict(averaged)
        new: Weights = {}
        for key, average in averaged.items():
            dtype = np.asarray(average).dtype
            if np.issubdtype(dtype, np.integer):
                new[key] = np.asarray(average)
                continue
            w, delta = np.asarray(current[key], np.float64), np.asarray(average, np.float64) - current[key]
            new[key] = (w + self._direction(key, delta, server_round)).astype(dtype)
        return new

    def _direction(self, key: str, delta: np.ndarray, server_round: int) -> np.ndarray:
        """The step added to the model for array ``key``, updating its moments."""
        s, state = self.settings, self.moments.setdefault(key, {})
        if s.name == "momentum":
            first = "m" not in state or s.momentum == 0.0
            state["m"] = -delta if first else s.momentum * state["m"] - delta
            return -s.lr * state["m"]
        state["m"] = s.beta_1 * state.get("m", 0.0) + (1 - s.beta_1) * delta
        v = state.get("v", np.zeros_like(delta))
        if s.name == "adam":
            state["v"] = s.beta_2 * v + (1 - s.beta_2) * delta**2
            eta = s.lr * np.sqrt(1 - s.beta_2 ** (server_round + 1.0)) / (1 - s.beta_1 ** (server_round + 1.0))
        else:
            state["v"] = v - (1 - s.beta_2) * delta**2 * np.sign(v - delta**2)
            eta = s.lr
        return eta * state["m"] / (np.sqrt(state["v"]) + s.tau)

    def state_dict(self) -> dict[str, Weights]:
        """The moments, and the filter memory's ratios where it has any, for checkpoints."""
        state = {key: dict(values) for key, values in self.moments.items()}
        memory = self.memory.state_dict()
        return {**state, MEMORY_KEY: memory} if memory else state

    def load_state_dict(self, state: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Restore :meth:`state_dict`'s output."""
        self.moments = {key: dict(values) for key, values in state.items() if key != MEMORY_KEY}
        self.memory = FilterMemory()
        self.memory.load_state_dict(state.get(MEMORY_KEY, {}))
