"""FedSM inference (Xu et al. 2022, Algorithm 2): route each image (or each case) through the super model."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn

from fedsm_core.algorithms.fedsm.settings import ROUTE_BY
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import set_weights

GLOBAL_ROUTE = -1
Gamma = float | tuple[float, ...]
"""One threshold for every personalized model, or one per model (``gamma-selection = "per-model"``)."""


def check_gamma(gamma: float | Sequence[float], num_models: int | None = None) -> Gamma:
    """``gamma`` as a float or a tuple of ``num_models`` floats, each in ``[0, 1]``; raises ``ValueError``."""
    values = [float(g) for g in gamma] if isinstance(gamma, (list, tuple)) else [float(gamma)]
    if any(not 0.0 <= g <= 1.0 for g in values):
        raise ValueError(f"gamma = {gamma} is outside [0, 1]")
    if not isinstance(gamma, (list, tuple)):
        return values[0]
    if num_models is not None and len(values) != num_models:
        raise ValueError(f"{len(values)} gammas for {num_models} personalized models; give one per model")
    return tuple(values)


def is_confident(confidence, gamma):
    """Algorithm 2's rule: an image goes to a personalized model when ``max(y_s) > gamma``, else to the global one.

    The one place the comparison is written; works elementwise on tensors and
    numpy arrays (``gamma`` a number or broadcastable array).
    """
    return confidence > gamma


def route(selector_probs: torch.Tensor, gamma: Gamma) -> torch.Tensor:
    """Choose a model per image from the selector's softmax output.

    ``y_s = softmax(f_s(x))``; if ``max(y_s) > gamma`` the image goes to the
    personalized model ``argmax(y_s)``, otherwise to the global model. With
    one threshold per model, ``gamma_k`` of the candidate ``k = argmax(y_s)``
    applies: a personalized model that does no better than the global model
    on validation gets ``gamma_k = 1`` and is never used.

    Parameters
    ----------
    selector_probs : torch.Tensor
        ``[B, K]`` probabilities (rows sum to 1).
    gamma : float or tuple of K floats
        Confidence threshold(s) in ``[0, 1]``; ``gamma = 0`` always picks a
        personalized model, ``gamma = 1`` always the global one.

    Returns
    -------
    torch.Tensor
        Long tensor ``[B]``: a site index in ``0..K-1`` or ``GLOBAL_ROUTE`` (-1).
    """
    if selector_probs.ndim != 2:
        raise ValueError(f"route: selector_probs must be [B, K], got shape {tuple(selector_probs.shape)}")
    gamma = check_gamma(gamma, selector_probs.shape[1])
    confidence, site = selector_probs.max(dim=1)
    threshold = torch.tensor(gamma, dtype=confidence.dtype, device=confidence.device)
    if threshold.ndim:
        threshold = threshold[site]
    return torch.where(is_confident(confidence, threshold), site, torch.full_like(site, GLOBAL_ROUTE))


def case_probabilities(log_probs: torch.Tensor, cases: Sequence[str | None]) -> torch.Tensor:
    """Selector probabilities that give every slice of a case the case's one decision.

    For a case ``c`` with slices ``S_c``,
    ``p_c = softmax(1/|S_c| sum_{i in S_c} log y_s(x_i))``, the normalized
    geometric mean of its slices' probabilities, and every slice of ``c`` gets
    ``p_c``; :func:`route` on these rows then decides once per case (argmax the
    site, ``max(p_c) <= gamma`` the global model). An image whose case is
    ``None`` keeps its own ``softmax(log_probs_i) = y_s(x_i)``: per-image routing.

    Parameters
    ----------
    log_probs : torch.Tensor
        ``[B, K]`` log-probabilities of the selector (``log_softmax`` of its logits).
    cases : sequence of str or None
        The case of every row (:func:`fedsm_core.data.cases.named_case`).

    Returns
    -------
    torch.Tensor
        ``[B, K]`` probabilities, rows of one case equal.
    """
    if log_probs.ndim != 2 or len(cases) != len(log_probs):
        raise ValueError(f"case_probabilities: log_probs must be [B, K] with one case per row, got shape "
                         f"{tuple(log_probs.shape)} and {len(cases)} cases")
    probs = torch.softmax(log_probs, dim=1)
    rows: dict[str, list[int]] = {}
    for index, case in enumerate(cases):
        if case is not None:
            rows.setdefault(case, []).append(index)
    for members in rows.values():
        chosen = torch.tensor(members, device=log_probs.device)
        probs[chosen] = torch.softmax(log_probs[chosen].mean(dim=0), dim=0)
    return probs


def route_cases(log_probs: torch.Tensor, cases: Sequence[str | None], gamma: Gamma) -> torch.Tensor:
    """Algorithm 2 once per case: :func:`route` on :func:`case_probabilities` (``route-by = "case"``).

    Every slice of a case takes the case's route; an image without a case is routed alone.
    """
    return route(case_probabilities(log_probs, cases), gamma)


def selector_probabilities(logits: torch.Tensor, cases: Sequence[str | None] | None = None,
                           route_by: str = "image") -> torch.Tensor:
    """The probabilities the super model routes with, by ``route-by``.

    ``"image"``: ``softmax(f_s(x))`` per image (the paper). ``"case"``:
    :func:`case_probabilities` of ``log_softmax(f_s(x))`` over ``cases``
    (images without a case fall back to their own softmax). ``SuperModel.routes``
    on the result is Algorithm 2 (or FedSM-extra's argmax) per image or per case.
    """
    if route_by not in ROUTE_BY:
        raise ValueError(f"route-by = {route_by!r} is not one of {list(ROUTE_BY)}; set route-by in "
                         "[tool.flwr.app.config] of pyproject.toml")
    if route_by == "image":
        return torch.softmax(logits, dim=1)
    if cases is None:
        raise ValueError("route-by = \"case\" needs the case of every image (the split's ids)")
    return case_probabilities(torch.log_softmax(logits, dim=1), cases)


def routed_scores(confidence: torch.Tensor, personalized: torch.Tensor, global_: torch.Tensor,
                  gamma: float) -> torch.Tensor:
    """Per-image score of the super model from the scores of the two candidate models.

    Algorithm 2 sends an image to personalized model ``argmax(y_s)`` when
    ``max(y_s) > gamma`` and to the global model otherwise, so its score is
    ``personalized`` where ``confidence > gamma`` and ``global_`` elsewhere. This
    lets one pass over the data score every gamma of a sweep.
    """
    return torch.where(is_confident(confidence, gamma), personalized, global_)


class MissingModel(nn.Module):
    """Stands for a personalized model that was not sent; using it is a protocol error, said plainly."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Refuse: an image was routed to a model this site was not sent."""
        raise RuntimeError(f"personalized model {self.index} was not sent to this site, but an image was routed "
                           "to it; the server sends the models the site's route query named")


class SuperModel(nn.Module):
    """The FedSM super model: a global model, K personalized models and a selector.

    Parameters
    ----------
    global_model : nn.Module
        The FedAvg global U-Net.
    personalized : sequence of nn.Module
        One SoftPull-personalized U-Net per training site, in site order.
    selector : nn.Module
        Site classifier with K outputs.
    gamma : float or tuple of K floats
        Confidence threshold of Algorithm 2, or one per personalized model.
    selector_includes_global : bool
        FedSM-extra: the selector has ``K + 1`` outputs, index 0 being the
        global model, and its argmax is followed without a threshold.
    """

    def __init__(
        self,
        global_model: nn.Module,
        personalized: Sequence[nn.Module],
        selector: nn.Module,
        gamma: Gamma,
        selector_includes_global: bool = False,
    ) -> None:
        super().__init__()
        self.selector_includes_global = selector_includes_global
        self.global_model = global_model
        self.personalized = nn.ModuleList(personalized)
        self.selector = selector
        self.gamma = check_gamma(gamma, None if selector_includes_global else len(personalized))

    @torch.no_grad()
    def forward_with_routes(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Segment ``images``; returns ``(logits, routes, selector_probs)``.

        Each model runs only on the images routed to it.
        """
        probs = torch.softmax(self.selector(images), dim=1)
        expected = len(self.personalized) + int(self.selector_includes_global)
        if probs.shape[1] != expected:
            raise ValueError(
                f"selector has {probs.shape[1]} outputs but the super model expects {expected} "
                f"({len(self.personalized)} personalized models)"
            )
        routes = self.routes(probs)
        return self.segment(images, routes), routes, probs

    @torch.no_grad()
    def segment(self, images: torch.Tensor, routes: torch.Tensor) -> torch.Tensor:
        """Logits of each image from the model of its route (``-1`` = global), each model on its images only."""
        logits: torch.Tensor | None = None
        for index in routes.unique().tolist():
            chosen = routes == index
            model = self.global_model if index == GLOBAL_ROUTE else self.personalized[index]
            part = model(images[chosen])
            if logits is None:
                logits = part.new_zeros((len(images), *part.shape[1:]))
            logits[chosen] = part
        assert logits is not None  # routes covers every image of a non-empty batch
        return logits

    def routes(self, probs: torch.Tensor) -> torch.Tensor:
        """Model index per image (-1 = global): Algorithm 2, or FedSM-extra's plain argmax."""
        if self.selector_includes_global:
            return probs.argmax(dim=1) - 1
        return route(probs, self.gamma)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, S, H, W]`` of the routed model for every image."""
        return self.forward_with_routes(images)[0]


def assemble_super_model(
    spec: ModelSpec,
    global_weights: Mapping[str, np.ndarray],
    personalized: Sequence[Mapping[str, np.ndarray] | None],
    selector_weights: Mapping[str, np.ndarray],
    gamma: Gamma,
    selector_includes_global: bool = False,
    names: Sequence[str] | None = None,
    where: str = "",
) -> SuperModel:
    """The super model as modules, from its weights: the one assembly the app, bundles and experiments share.

    Parameters
    ----------
    spec : ModelSpec
        Builds the U-Nets and the selector; FedSM-extra's selector gets ``K + 1`` outputs.
    personalized : sequence of weight dictionaries or None
        One per training site, in site order; ``None`` for a model that was
        not sent (:mod:`fedsm_core.algorithms.fedsm.needed_models`), which
        raises if an image is ever routed to it.
    names : sequence of str, optional
        Site names, used in error messages (default: the indices).
    where : str
        Prefix of error messages (e.g. the bundle's path).
    """
    names = list(names) if names is not None else [str(index) for index in range(len(personalized))]
    if len(names) != len(personalized):
        raise ValueError(f"{where}{len(personalized)} personalized models for {len(names)} sites {names}")
    global_model = spec.load_segmentation(global_weights, f"{where}global model")
    models = []
    for index, (name, weights) in enumerate(zip(names, personalized, strict=True)):
        if weights is None:
            models.append(MissingModel(index))
            continue
        models.append(spec.load_segmentation(weights, f"{where}personalized model of {name}"))
    selector_spec = dataclasses.replace(spec, num_sites=spec.num_sites + int(selector_includes_global))
    selector = selector_spec.build_selector()
    set_weights(selector, selector_weights, f"{where}selector")
    return SuperModel(global_model, models, selector, gamma, selector_includes_global).eval()
