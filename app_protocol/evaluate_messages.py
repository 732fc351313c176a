"""Evaluation and query messages: paired encoders and decoders (training: :mod:`app_protocol.train_messages`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import RecordDict

from app_protocol import records
from fedsm_core.algorithms.fedsm.super_model import Gamma, check_gamma
from fedsm_core.models.weights import Weights

SPLITS = ("val", "test")


@dataclasses.dataclass(frozen=True)
class SuperModelWeights:
    """Algorithm 2's inputs as weights: personalized models in site order, the selector and gamma."""

    personalized: list[Weights | None]  # None: not sent, no image of the site is routed to it
    selector: Weights
    gamma: Gamma
    gamma_sweep: tuple[float, ...]
    selector_includes_global: bool


@dataclasses.dataclass(frozen=True)
class EvaluationRequest:
    """What to evaluate on which split: one model, or the super model around it."""

    split: str
    global_weights: Weights
    super_model: SuperModelWeights | None
    overlay_dir: str = ""  # the run folder's overlays/ when the server asks for the report's test images


# --- evaluation -------------------------------------------------------------------------------------


def encode_model_evaluation(weights: Weights, split: str) -> RecordDict:
    """Evaluate one model (the global model, or a FedBN site's own) on ``split``."""
    return RecordDict({records.GLOBAL: records.to_record(weights),
                       records.CONFIG: records.to_config({"split": _check_split(split)})})


def encode_super_model_evaluation(global_weights: Weights, personalized: Sequence[Weights], selector: Weights,
                                  split: str, gamma: Gamma, gamma_sweep: Sequence[float] = (),
                                  selector_includes_global: bool = False,
                                  send: Sequence[int] | None = None) -> RecordDict:
    """Evaluate the super model on ``split``; validation also sweeps ``gamma_sweep``.

    ``send`` lists the personalized models the site needs (its answer to an
    ``ASK_MODELS`` query); ``None`` sends all of them.
    """
    settings: dict[str, object] = {
        "split": _check_split(split), "gamma": list(gamma) if isinstance(gamma, tuple) else float(gamma),
        "gamma-sweep": [float(g) for g in gamma_sweep],
    }
    if selector_includes_global:
        settings["selector-includes-global"] = True
    if send is not None:
        settings["sent-models"] = sorted({int(k) for k in send})
    models = records.models_to_record(personalized) if send is None \
        else records.models_to_record_subset(personalized, send)
    return RecordDict({records.GLOBAL: records.to_record(global_weights), records.PERSONALIZED: models,
                       records.SELECTOR: records.to_record(selector), records.CONFIG: records.to_config(settings)})


def ask_for_overlays(content: RecordDict, folder: str) -> RecordDict:
    """Ask a site to draw test images with contours for the run report (:mod:`fedsm_core.report.overlays`).

    ``folder`` is the run folder's ``overlays/``: a simulated site writes
    there, a deployed one into a folder on its own machine. Changes and
    returns ``content``.
    """
    content[records.CONFIG][records.OVERLAY_DIR] = str(folder)
    return content


def decode_evaluation(content: RecordDict, num_sites: int) -> EvaluationRequest:
    """Inverse of both evaluation encoders (and :func:`ask_for_overlays`); ``num_sites`` models are expected."""
    config = content[records.CONFIG]
    split = _check_split(str(config["split"]))
    global_weights = records.from_record(content[records.GLOBAL])
    overlay_dir = str(config.get(records.OVERLAY_DIR, ""))
    if records.PERSONALIZED not in content:
        return EvaluationRequest(split, global_weights, None, overlay_dir)
    gamma = config["gamma"]
    super_model = SuperModelWeights(
        personalized=records.models_from_record(content[records.PERSONALIZED], num_sites,
                                                [int(k) for k in config.get("sent-models", range(num_sites))]),
        selector=records.from_record(content[records.SELECTOR]),
        gamma=check_gamma(tuple(gamma) if isinstance(gamma, list) else float(gamma)),
        gamma_sweep=tuple(float(g) for g in config.get("gamma-sweep", [])),
        selector_includes_global=bool(config.get("selector-includes-global", False)),
    )
    return EvaluationRequest(split, global_weights, super_model, overlay_dir)


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"evaluate: split '{split}' is not one of {list(SPLITS)}")
    return split


def encode_metrics(metrics: Mapping[str, float | list[float]]) -> RecordDict:
    """An evaluation reply: its metrics."""
    return RecordDict({records.METRICS: records.to_metrics(metrics)})


def decode_metrics(content: RecordDict) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Numbers and lists (sweeps) of a reply's metrics, apart."""
    metrics = content[records.METRICS]
    return ({key: float(value) for key, value in metrics.items() if not isinstance(value, list)},
            {key: [float(x) for x in value] for key, value in metrics.items() if isinstance(value, list)})


# --- queries ------------------------------------------------------------------------------------------


def encode_query(ask: str, selector: Weights | None = None, **settings: object) -> RecordDict:
    """A QUERY asking ``ask`` (:data:`records.ASK_NODE`, ``ASK_SITE``, ``SELECTOR_STATISTICS``, ``ASK_MODELS``).

    ``settings`` go with it (``ASK_MODELS``: ``split`` and ``selector-includes-global``).
    """
    content = RecordDict({records.CONFIG: records.to_config({records.ASK: ask, **settings})})
    if selector is not None:
        content[records.SELECTOR] = records.to_record(selector)
    return content


def decode_query(content: RecordDict) -> str:
    """What a QUERY asks; ``site`` when it does not say."""
    asked = str(content[records.CONFIG].get(records.ASK, records.ASK_SITE)) if records.CONFIG in content \
        else records.ASK_SITE
    known = (records.ASK_NODE, records.ASK_SITE, records.SELECTOR_STATISTICS, records.ASK_MODELS)
    if asked not in known:
        raise ValueError(f"query: unknown ask '{asked}'; expected one of {list(known)}")
    return asked


def decode_statistics_query(content: RecordDict) -> Weights:
    """The selector whose embedding statistics (or routes, ``ASK_MODELS``) are asked for."""
    return records.from_record(content[records.SELECTOR])


def encode_models_query(selector: Weights, split: str, selector_includes_global: bool = False) -> RecordDict:
    """Ask a site which personalized models ``selector`` routes its ``split`` images to."""
    return encode_query(records.ASK_MODELS, selector, split=_check_split(split),
                        **{"selector-includes-global": bool(selector_includes_global)})


def decode_models_query(content: RecordDict) -> tuple[Weights, str, bool]:
    """Inverse of :func:`encode_models_query`: the selector, the split and whether it has a global output."""
    config = content[records.CONFIG]
    return (records.from_record(content[records.SELECTOR]), _check_split(str(config["split"])),
            bool(config.get("selector-includes-global", False)))


def encode_models_reply(indices: Sequence[int]) -> RecordDict:
    """The personalized models a site's evaluation needs."""
    return RecordDict({records.NEEDED_MODELS: records.to_config({"models": [int(k) for k in indices]})})


def decode_models_reply(content: RecordDict, num_sites: int) -> list[int]:
    """Inverse of :func:`encode_models_reply`; an index outside ``0..num_sites-1`` raises ``ValueError``."""
    indices = sorted({int(k) for k in content[records.NEEDED_MODELS]["models"]})
    if any(not 0 <= k < num_sites for k in indices):
        raise ValueError(f"needed models {indices} are not all among the {num_sites} personalized models")
    return indices


def encode_node_reply(identity: Mapping[str, object]) -> RecordDict:
    """Who a node is: its ``site-name``, or its ``partition-id`` and ``num-partitions``."""
    return RecordDict({records.NODE: records.to_config(dict(identity))})


def decode_node_reply(content: RecordDict) -> dict[str, object]:
    """Inverse of :func:`encode_node_reply`."""
    return dict(content[records.NODE])


def encode_site_reply(report: Mapping[str, object]) -> RecordDict:
    """A site's split sizes and pixel statistics."""
    return RecordDict({records.SITE: records.to_config(dict(report))})


def decode_site_reply(content: RecordDict) -> dict[str, object]:
    """Inverse of :func:`encode_site_reply`."""
    return dict(content[records.SITE])


def encode_statistics_reply(arrays: Mapping[str, np.ndarray]) -> RecordDict:
    """A site's selector embedding statistics (count, sum, Gram matrix)."""
    return RecordDict({records.SELECTOR_STATISTICS: records.to_record(arrays)})


def decode_statistics_reply(content: RecordDict) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode_statistics_reply`."""
    return records.from_record(content[records.SELECTOR_STATISTICS])
