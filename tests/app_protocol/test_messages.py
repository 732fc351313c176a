"""Every encoder's decoder gives back what was encoded, through Flower's records."""

from __future__ import annotations

import numpy as np
import pytest

from app_protocol import records
from app_protocol.evaluate_messages import (
    decode_evaluation,
    decode_metrics,
    decode_models_query,
    decode_models_reply,
    decode_node_reply,
    decode_query,
    decode_site_reply,
    decode_statistics_query,
    decode_statistics_reply,
    encode_metrics,
    encode_model_evaluation,
    encode_models_query,
    encode_models_reply,
    encode_node_reply,
    encode_query,
    encode_site_reply,
    encode_statistics_reply,
    encode_super_model_evaluation,
)
from app_protocol.train_messages import (
    FEDSM_KEYS,
    decode_fedsm_reply,
    decode_fedsm_train,
    decode_personalized,
    decode_train,
    decode_weights,
    encode_extra_selector_train,
    encode_fedsm_reply,
    encode_fedsm_train,
    encode_fine_tune,
    encode_fine_tune_reply,
    encode_model_reply,
    encode_model_train,
    encode_selector_reply,
)
from fedsm_core.algorithms.fedsm.fedsm import FedSMPayload, FedSMUpdate


def w(*values: float) -> dict[str, np.ndarray]:
    return {"w": np.array(values, dtype=np.float32), "n": np.array(len(values), dtype=np.int64)}


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_model_train_and_reply_round_trip_with_and_without_control_variates():
    request = decode_train(encode_model_train(w(1.0, 2.0), 3))
    assert request.server_round == 3 and request.phase == "" and set(request.weights) == {records.GLOBAL}
    assert same(request.weights[records.GLOBAL], w(1.0, 2.0))
    with_control = decode_train(encode_model_train(w(1.0), 4, server_control=w(0.5)))
    assert same(with_control.weights[records.SERVER_CONTROL], w(0.5))

    reply = encode_model_reply(w(3.0), {"loss": 0.25}, 12, control_delta=w(-1.0))
    decoded = decode_weights(reply, [records.GLOBAL, records.CONTROL_DELTA])
    assert same(decoded[records.GLOBAL], w(3.0)) and same(decoded[records.CONTROL_DELTA], w(-1.0))
    assert reply[records.METRICS]["num-examples"] == 12 and reply[records.METRICS]["loss"] == 0.25


def test_fedsm_train_and_reply_round_trip():
    payload = FedSMPayload(w(1.0), w(2.0), w(3.0), {})
    assert decode_train(encode_fedsm_train(payload, 7, "models")).phase == "models"
    back = decode_fedsm_train(decode_train(encode_fedsm_train(payload, 7)))
    for key, original in zip(("global_weights", "personal_weights", "selector_weights", "selector_optimizer"),
                             (w(1.0), w(2.0), w(3.0), {}), strict=True):
        assert same(getattr(back, key), original)

    update = FedSMUpdate(w(4.0), w(5.0), w(6.0), w(7.0), num_examples=9)
    content = encode_fedsm_reply(update, {"loss": 1.0})
    decoded = decode_fedsm_reply(decode_weights(content, FEDSM_KEYS), int(content[records.METRICS]["num-examples"]))
    assert decoded.num_examples == 9
    assert same(decoded.global_weights, w(4.0)) and same(decoded.selector_optimizer, w(7.0))


def test_extra_selector_round_trip_keeps_the_site_order_of_the_personalized_models():
    personalized = [w(float(k)) for k in range(3)]
    request = decode_train(encode_extra_selector_train(w(9.0), personalized, w(8.0), w(7.0), 11))
    assert request.phase == "selector" and request.server_round == 11
    assert all(same(a, b) for a, b in zip(decode_personalized(request, 3), personalized, strict=True))
    reply = encode_selector_reply(w(1.0), w(2.0), {"loss": 0.5}, 4)
    decoded = decode_weights(reply, [records.SELECTOR, records.SELECTOR_OPTIMIZER])
    assert same(decoded[records.SELECTOR], w(1.0)) and reply[records.METRICS]["num-examples"] == 4


def test_fine_tune_request_and_reply_round_trip():
    request = decode_train(encode_fine_tune(w(9.0), 31))
    assert request.phase == "fine-tune" and request.server_round == 31
    assert same(request.weights[records.GLOBAL], w(9.0)) and set(request.weights) == {records.GLOBAL}
    reply = encode_fine_tune_reply(w(1.0), 2, [0.5, 0.6, 0.7, 0.65], 4)
    assert same(decode_weights(reply, [records.PERSONAL])[records.PERSONAL], w(1.0))
    metrics = reply[records.METRICS]
    assert (metrics["fine-tune-passes"], metrics["fine-tune-val-dice-before"], metrics["fine-tune-val-dice"],
            metrics["num-examples"]) == (2, 0.5, 0.7, 4)


@pytest.mark.parametrize("gamma", [0.35, (0.0, 1.0, 0.5)])
def test_super_model_evaluation_round_trips_one_gamma_or_one_per_model(gamma):
    personalized = [w(float(k)) for k in range(3)]
    content = encode_super_model_evaluation(w(9.0), personalized, w(8.0), "val", gamma, (0.0, 0.5))
    request = decode_evaluation(content, 3)
    assert request.split == "val" and same(request.global_weights, w(9.0))
    model = request.super_model
    assert model is not None and model.gamma == gamma and model.gamma_sweep == (0.0, 0.5)
    assert not model.selector_includes_global and same(model.selector, w(8.0))
    assert all(same(a, b) for a, b in zip(model.personalized, personalized, strict=True))


def test_one_model_evaluation_has_no_super_model_and_a_bad_split_is_refused():
    request = decode_evaluation(encode_model_evaluation(w(1.0), "test"), 3)
    assert request.split == "test" and request.super_model is None
    with pytest.raises(ValueError, match="split 'train'"):
        encode_model_evaluation(w(1.0), "train")


def test_a_super_model_message_with_too_few_models_is_refused():
    content = encode_super_model_evaluation(w(9.0), [w(0.0), w(1.0)], w(8.0), "test", 0.5)
    with pytest.raises(ValueError, match="model"):
        decode_evaluation(content, 3)


def test_queries_and_their_replies_round_trip():
    assert decode_query(encode_query(records.ASK_NODE)) == records.ASK_NODE
    query = encode_query(records.SELECTOR_STATISTICS, w(1.0, 2.0))
    assert decode_query(query) == records.SELECTOR_STATISTICS and same(decode_statistics_query(query), w(1.0, 2.0))
    with pytest.raises(ValueError, match="unknown ask 'weather'"):
        decode_query(encode_query("weather"))
    assert decode_node_reply(encode_node_reply({"site-name": "site-2"})) == {"site-name": "site-2"}
    report = {"site-index": 1, "site-name": "b", "pixel-mean": [0.5, 0.25]}
    assert decode_site_reply(encode_site_reply(report)) == report
    arrays = {"count": np.array(3.0), "sum": np.arange(4.0)}
    assert same(decode_statistics_reply(encode_statistics_reply(arrays)), arrays)


def test_metrics_come_back_as_numbers_and_sweeps_apart():
    numbers, lists = decode_metrics(encode_metrics({"dice": 0.5, "dice-super-sweep": [0.1, 0.2]}))
    assert numbers == {"dice": 0.5} and lists == {"dice-super-sweep": [0.1, 0.2]}


def test_a_route_names_the_site_and_its_absence_reads_none():
    content = records.with_route(encode_query(records.ASK_SITE), "site-3")
    assert records.decode_route(content) == "site-3" and records.decode_route(encode_query(records.ASK_SITE)) is None


def test_a_super_model_message_may_carry_only_the_needed_models():
    personalized = [w(float(k)) for k in range(4)]
    content = encode_super_model_evaluation(w(9.0), personalized, w(8.0), "test", 0.5, send=[2, 0])
    model = decode_evaluation(content, 4).super_model
    assert [m is not None for m in model.personalized] == [True, False, True, False]
    assert same(model.personalized[2], w(2.0))
    assert len(content[records.PERSONALIZED]) == 2 * len(w(0.0))  # two models' arrays, not four


def test_the_needed_models_query_and_reply_round_trip():
    selector, split, includes_global = decode_models_query(encode_models_query(w(1.0), "val", True))
    assert same(selector, w(1.0)) and split == "val" and includes_global
    assert decode_query(encode_models_query(w(1.0), "test")) == records.ASK_MODELS
    assert decode_models_reply(encode_models_reply([2, 0, 2]), 3) == [0, 2]
    with pytest.raises(ValueError, match=r"needed models \[0, 5\]"):
        decode_models_reply(encode_models_reply([0, 5]), 3)
