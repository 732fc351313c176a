"""Paired encoders and decoders of every message kind the two apps exchange.

Each ``encode_*`` has its ``decode_*``; a test round-trips every pair. The
ServerApp encodes requests and decodes replies, the ClientApp the reverse, and
neither spells a record key outside this package.

Message kinds
-------------
* training of one model (FedAvg, FedProx, SCAFFOLD, HarmoFL, FedBN) and its reply;
* FedSM training (global, own personalized model, selector, its moments) and its reply;
* FedSM-extra's selector training (the whole super model, the ``K + 1`` selector) and its reply;
* FedSM's final fine-tuning (the final global model) and its reply (the site's personalized model);
* evaluation of one model, or of the super model (Algorithm 2's inputs and gamma);
* queries: which node this is, a site's data sizes and pixel statistics, the
  embedding statistics of a selector.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from app_protocol import records
from fedsm_core.algorithms.fedsm.fedsm import FedSMPayload, FedSMUpdate
from fedsm_core.models.weights import Weights

Metrics = Mapping[str, float | list[float]]


@dataclasses.dataclass(frozen=True)
class TrainRequest:
    """A training message: its round, its phase (FedSM-extra) and the weights it carries by record key."""

    server_round: int
    phase: str
    weights: dict[str, Weights]
    state_key: str = ""  # the run key of the site's kept state (records.STATE_KEY in the route)
    personalized: ArrayRecord | None = None  # FedSM-extra's extra rounds: every site's model, see decode_personalized


def _config(content: RecordDict) -> ConfigRecord:
    return content[records.CONFIG] if records.CONFIG in content else ConfigRecord()


# --- training of one model --------------------------------------------------------------------------


def encode_model_train(weights: Weights, server_round: int, server_control: Weights | None = None,
                       optimizer_state: Weights | None = None) -> RecordDict:
    """One model to train (``GLOBAL``), SCAFFOLD's server control variate, and the averaged Adam state, when given."""
    content = RecordDict({records.GLOBAL: records.to_record(weights),
                          records.CONFIG: records.to_config({"server-round": server_round})})
    if server_control is not None:
        content[records.SERVER_CONTROL] = records.to_record(server_control)
    if optimizer_state is not None:
        content[records.OPTIMIZER_STATE] = records.to_record(optimizer_state)
    return content


def decode_train(content: RecordDict) -> TrainRequest:
    """Any training message: round, phase and every weight record it holds."""
    config = _config(content)
    keys = (records.GLOBAL, records.PERSONAL, records.SELECTOR, records.SELECTOR_OPTIMIZER, records.SERVER_CONTROL,
            records.OPTIMIZER_STATE)
    weights = {key: records.from_record(content[key]) for key in keys if key in content}
    return TrainRequest(int(config["server-round"]), str(config.get("phase", "")), weights,
                        records.decode_state_key(content) or "", content.get(records.PERSONALIZED))


def encode_model_reply(weights: Weights, metrics: Metrics, num_examples: int,
                       control_delta: Weights | None = None, optimizer_state: Weights | None = None) -> RecordDict:
    """The trained model, its metrics and training-set size, SCAFFOLD's ``c_k+ - c_k``, and the site's Adam state."""
    content = RecordDict({records.GLOBAL: records.to_record(weights),
                          records.METRICS: records.to_metrics({**metrics, "num-examples": num_examples})})
    if control_delta is not None:
        content[records.CONTROL_DELTA] = records.to_record(control_delta)
    if optimizer_state is not None:
        content[records.OPTIMIZER_STATE] = records.to_record(optimizer_state)
    return content


def decode_weights(content: RecordDict, keys: Sequence[str]) -> dict[str, Weights]:
    """The weight records ``keys`` of a reply; a missing key raises ``KeyError`` naming it."""
    return {key: records.from_record(content[key]) for key in keys}


# --- FedSM ------------------------------------------------------------------------------------------


def encode_fedsm_train(payload: FedSMPayload, server_round: int, phase: str = "") -> RecordDict:
    """Algorithm 1's inputs at one site: global, its own personalized model, selector and moments."""
    settings: dict[str, object] = {"server-round": server_round}
    if phase:
        settings["phase"] = phase
    return RecordDict({
        records.GLOBAL: records.to_record(payload.global_weights),
        records.PERSONAL: records.to_record(payload.personal_weights),
        records.SELECTOR: records.to_record(payload.selector_weights),
        records.SELECTOR_OPTIMIZER: records.to_record(payload.selector_optimizer),
        records.CONFIG: records.to_config(settings),
    })


def decode_fedsm_train(request: TrainRequest) -> FedSMPayload:
    """The FedSM payload of a decoded training message (:func:`decode_train` of :func:`encode_fedsm_train`)."""
    return FedSMPayload(*(request.weights[key] for key in FEDSM_KEYS))


FEDSM_KEYS = (records.GLOBAL, records.PERSONAL, records.SELECTOR, records.SELECTOR_OPTIMIZER)


def encode_fedsm_reply(update: FedSMUpdate, metrics: Metrics) -> RecordDict:
    """A site's FedSM update and its training metrics."""
    content = RecordDict({key: records.to_record(value) for key, value in zip(
        FEDSM_KEYS, (update.global_weights, update.personal_weights, update.selector_weights,
                     update.selector_optimizer), strict=True)})
    content[records.METRICS] = records.to_metrics({**metrics, "num-examples": update.num_examples})
    return content


def decode_fedsm_reply(weights: Mapping[str, Weights], num_examples: int, steps: float = float("nan")) -> FedSMUpdate:
    """The update of a reply whose records :func:`decode_weights` read (and the server checked)."""
    return FedSMUpdate(*(weights[key] for key in FEDSM_KEYS), num_examples=num_examples, steps=steps)


def encode_extra_selector_train(global_weights: Weights, personalized: Sequence[Weights], selector: Weights,
                                moments: Weights, server_round: int) -> RecordDict:
    """FedSM-extra's extra round: the whole super model and the ``K + 1``-output selector with its moments."""
    return RecordDict({
        records.GLOBAL: records.to_record(global_weights),
        records.PERSONALIZED: records.models_to_record(personalized),
        records.SELECTOR: records.to_record(selector),
        records.SELECTOR_OPTIMIZER: records.to_record(moments),
        records.CONFIG: records.to_config({"server-round": server_round, "phase": "selector"}),
    })


def decode_personalized(request: TrainRequest, count: int) -> list[Weights]:
    """The ``count`` personalized models of an extra-round message, in site order."""
    if request.personalized is None:
        raise ValueError("this training message carries no personalized models (not a FedSM-extra selector round)")
    return records.models_from_record(request.personalized, count)


def encode_selector_reply(weights: Weights, moments: Weights, metrics: Metrics, num_examples: int) -> RecordDict:
    """A site's trained selector (FedSM-extra) and its Adam moments."""
    return RecordDict({
        records.SELECTOR: records.to_record(weights),
        records.SELECTOR_OPTIMIZER: records.to_record(moments),
        records.METRICS: records.to_metrics({**metrics, "num-examples": num_examples}),
    })


# --- FedSM's final fine-tuning ------------------------------------------------------------------------

FINE_TUNE = "fine-tune"  # the phase of the message sent after FedSM's last round (fine-tune-passes > 0)


def encode_fine_tune(global_weights: Weights, server_round: int) -> RecordDict:
    """The final global model, for a site to fine-tune into its personalized model (phase ``fine-tune``)."""
    return RecordDict({
        records.GLOBAL: records.to_record(global_weights),
        records.CONFIG: records.to_config({"server-round": server_round, "phase": FINE_TUNE}),
    })


def encode_fine_tune_reply(weights: Weights, passes: int, curve: Sequence[float], num_examples: int) -> RecordDict:
    """A site's fine-tuned personalized model, the passes it kept and its validation Dice before and after."""
    return RecordDict({
        records.PERSONAL: records.to_record(weights),
        records.METRICS: records.to_metrics({"fine-tune-passes": passes, "fine-tune-val-dice-before": curve[0],
                                             "fine-tune-val-dice": curve[passes], "num-examples": num_examples}),
    })
