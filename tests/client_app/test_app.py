"""ClientApp handlers, called with hand-built messages (no simulation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, MessageType, RecordDict

from app_protocol import records
from app_protocol.evaluate_messages import decode_models_reply, encode_models_query
from client_app import app as client
from client_app.site import resolve_site_index
from client_app.site_state import load_site_state
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import dataset_info
from fedsm_core.models.selector import Selector
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights

TINY = {"image-size": 32, "data-scale": 0.1, "max-local-steps": 1, "selector-width": 4, "batch-size": 4}
SITE = 2


def _context() -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": SITE}, state=RecordDict(), run_config=TINY)


def _spec() -> ModelSpec:
    config = RunConfig.from_mapping(TINY)
    info = dataset_info(config.dataset)
    return config.model_spec(len(info.structures), info.num_sites)


def _message(content: dict, message_type: str) -> Message:
    return Message(RecordDict(content), message_type=message_type, dst_node_id=7)


def test_query_reports_the_site_of_the_partition():
    # Prepare
    msg = _message({records.CONFIG: records.to_config({"ask": "site"})}, MessageType.QUERY)

    # Execute
    reply = client.query(msg, _context())

    # Assert
    site = reply.content[records.SITE]
    assert site["site-index"] == SITE
    assert site["site-name"] == dataset_info("synthetic-fundus").site_names[SITE]
    assert site["num-train"] > 0 and site["num-val"] > 0 and site["num-test"] > 0


def test_query_for_selector_statistics_returns_the_sums_of_the_training_embeddings():
    # Prepare
    selector = _spec().build_selector()
    msg = _message({records.SELECTOR: records.to_record(get_weights(selector)),
                    records.CONFIG: records.to_config({records.ASK: records.SELECTOR_STATISTICS})}, MessageType.QUERY)

    # Execute
    reply = client.query(msg, _context())

    # Assert: four flipped views of every training image (augmentation = flip), D = 8 * 4 + 6 + 2 * 4
    sums = records.from_record(reply.content[records.SELECTOR_STATISTICS])
    site = client.query(_message({}, MessageType.QUERY), _context()).content[records.SITE]
    assert sums["count"][0] == 4 * site["num-train"]
    assert sums["sum"].shape == (selector.feature_dim,) and selector.feature_dim == 46
    assert sums["gram"].shape == (46, 46)
    np.testing.assert_allclose(sums["gram"], sums["gram"].T)


def test_query_with_an_unknown_ask_is_refused():
    msg = _message({records.CONFIG: records.to_config({records.ASK: "weights"})}, MessageType.QUERY)
    with pytest.raises(ValueError, match="unknown ask 'weights'"):
        client.query(msg, _context())


def test_train_returns_updated_models_and_the_site_size():
    # Prepare
    spec = _spec()
    segmentation, selector = get_weights(spec.build_segmentation()), get_weights(spec.build_selector())
    msg = _message(
        {
            records.GLOBAL: records.to_record(segmentation),
            records.PERSONAL: records.to_record(segmentation),
            records.SELECTOR: records.to_record(selector),
            records.SELECTOR_OPTIMIZER: records.to_record({}),
            records.CONFIG: records.to_config({"server-round": 1}),
        },
        MessageType.TRAIN,
    )

    # Execute
    reply = client.train(msg, _context())

    # Assert
    content = reply.content
    new_selector = records.from_record(content[records.SELECTOR])
    assert set(new_selector) == set(selector)
    assert any(not np.array_equal(new_selector[k], selector[k]) for k in selector)
    assert set(records.from_record(content[records.PERSONAL])) == set(segmentation)
    # selector-moments = local (the default): the moments stay at the site, the reply carries none
    assert records.from_record(content[records.SELECTOR_OPTIMIZER]) == {}
    site_name = dataset_info("synthetic-fundus").site_names[SITE]
    kept = load_site_state(1, site_name, records.SELECTOR_MOMENTS_STATE)
    assert all(float(kept[f"{name}/step"]) == 1.0 for name in ("classifier.weight", "classifier.bias"))
    averaged = Context(run_id=2, node_id=7, node_config={"partition-id": SITE}, state=RecordDict(),
                       run_config={**TINY, "selector-moments": "averaged"})
    moments = records.from_record(client.train(msg, averaged).content[records.SELECTOR_OPTIMIZER])
    assert all(float(moments[f"{name}/step"]) == 1.0 for name in ("classifier.weight", "classifier.bias"))
    metrics = content[records.METRICS]
    assert metrics["steps"] == 1.0
    site = client.query(_message({}, MessageType.QUERY), _context()).content[records.SITE]
    assert metrics["num-examples"] == site["num-train"]


def test_evaluate_reports_dice_and_selector_accuracy_in_range():
    # Prepare
    spec = _spec()
    segmentation = get_weights(spec.build_segmentation())
    msg = _message(
        {
            records.GLOBAL: records.to_record(segmentation),
            records.PERSONALIZED: records.models_to_record([segmentation] * spec.num_sites),
            records.SELECTOR: records.to_record(get_weights(spec.build_selector())),
            records.CONFIG: records.to_config({"split": "val", "gamma": 0.5, "gamma-sweep": [0.0, 0.5, 1.0]}),
        },
        MessageType.EVALUATE,
    )

    # Execute
    metrics = client.evaluate(msg, _context()).content[records.METRICS]

    # Assert
    for key in ("dice-global", "dice-personal", "dice-super", "selector-accuracy", "share-global"):
        assert 0.0 <= metrics[key] <= 1.0
    # Identical global and personalized weights: routing cannot change the prediction.
    assert metrics["dice-super"] == pytest.approx(metrics["dice-global"])
    # gamma = 1 sends every image to the global model; the sweep entry at 0.5 is dice-super.
    sweep = metrics["dice-super-sweep"]
    assert len(sweep) == 3 and sweep[2] == pytest.approx(metrics["dice-global"])
    assert sweep[1] == pytest.approx(metrics["dice-super"])


def test_site_logs_its_device_once_per_run(monkeypatch):
    # Prepare
    lines = []
    monkeypatch.setattr(client, "log", lambda level, text, *args: lines.append(text % args))
    context = _context()
    msg = _message({records.CONFIG: records.to_config({"ask": "site"})}, MessageType.QUERY)

    # Execute: the node's state outlives each message, so the second message logs nothing
    client.query(msg, context)
    client.query(msg, context)

    # Assert
    site_name = dataset_info("synthetic-fundus").site_names[SITE]
    assert len(lines) == 1 and lines[0].startswith(f"site {site_name} trains on ")
    assert ("cuda" if torch.cuda.is_available() else "cpu") in lines[0]
    assert records.DEVICE_STATE in context.state


def test_cuda_run_config_on_a_worker_without_gpu_names_the_gpu_share_settings(monkeypatch):
    # Prepare: a Ray worker given no GPU share (Ray hid the GPUs)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    context = Context(run_id=1, node_id=7, node_config={"partition-id": SITE}, state=RecordDict(),
                      run_config={**TINY, "device": "cuda"})
    msg = _message({records.CONFIG: records.to_config({"ask": "site"})}, MessageType.QUERY)

    # Execute / Assert
    with pytest.raises(ValueError, match=r"device = 'cuda' but this process sees no CUDA GPU.*"
                                         r"CLIENT_GPUS=auto.*client-resources-num-gpus"):
        client.query(msg, context)


def test_site_is_taken_from_site_name_before_partition_id():
    names = ("a", "b", "c")
    assert resolve_site_index({"site-name": "c", "partition-id": 0}, names) == 2
    assert resolve_site_index({"partition-id": 1}, names) == 1


@pytest.mark.parametrize(
    ("node_config", "match"),
    [({"site-name": "x"}, "not a site"), ({"partition-id": 3}, "num-supernodes=3"), ({}, "--node-config")],
)
def test_bad_node_config_is_explained(node_config, match):
    with pytest.raises(ValueError, match=match):
        resolve_site_index(node_config, ("a", "b", "c"))


def test_models_record_round_trip_and_missing_model():
    # Prepare
    models = [{"w": np.full((2,), float(i), np.float32), "n": np.asarray(i, np.int64)} for i in range(3)]

    # Execute
    restored = records.models_from_record(records.models_to_record(models), 3)

    # Assert
    for original, back in zip(models, restored, strict=True):
        assert back["n"].shape == () and back["n"] == original["n"]
        np.testing.assert_array_equal(back["w"], original["w"])
    with pytest.raises(ValueError, match=r"no weights for model\(s\) \[3\]"):
        records.models_from_record(records.models_to_record(models), 4)


def _single_model_message(spec: ModelSpec, server_control: dict | None) -> Message:
    content = {
        records.GLOBAL: records.to_record(get_weights(spec.build_segmentation())),
        records.CONFIG: records.to_config({"server-round": 1}),
    }
    if server_control is not None:
        content[records.SERVER_CONTROL] = records.to_record(server_control)
    return _message(content, MessageType.TRAIN)


def _site_state(key: str) -> dict[str, np.ndarray]:
    state = load_site_state(1, dataset_info("synthetic-fundus").site_names[SITE], key)
    assert state is not None
    return state


def test_scaffold_client_keeps_its_control_variate_in_the_site_state():
    # Prepare
    spec = _spec()
    context = Context(run_id=1, node_id=7, node_config={"partition-id": SITE}, state=RecordDict(),
                      run_config={**TINY, "strategy": "scaffold"})
    model = spec.build_segmentation()
    zeros = {name: np.zeros(tuple(p.shape), np.float32) for name, p in model.named_parameters()}

    # Execute
    first = client.train(_single_model_message(spec, zeros), context)
    stored = _site_state(records.CLIENT_CONTROL_STATE)
    second = client.train(_single_model_message(spec, zeros), context)

    # Assert: round 1 starts from c_k = 0, so its delta is the new c_k itself;
    # round 2's delta is measured from the stored c_k.
    delta = records.from_record(first.content[records.CONTROL_DELTA])
    for name in zeros:
        np.testing.assert_array_equal(delta[name], stored[name])
    second_delta = records.from_record(second.content[records.CONTROL_DELTA])
    latest = _site_state(records.CLIENT_CONTROL_STATE)
    name = next(iter(zeros))
    np.testing.assert_allclose(second_delta[name], latest[name] - stored[name], atol=1e-7)


def test_fedavg_client_returns_only_the_model_and_evaluates_the_global_model():
    # Prepare
    spec = _spec()
    context = Context(run_id=1, node_id=7, node_config={"partition-id": SITE}, state=RecordDict(),
                      run_config={**TINY, "strategy": "fedavg"})

    # Execute
    reply = client.train(_single_model_message(spec, None), context)
    evaluation = client.evaluate(
        _message({records.GLOBAL: reply.content[records.GLOBAL],
                  records.CONFIG: records.to_config({"split": "test"})}, MessageType.EVALUATE),
        context,
    )

    # Assert
    assert set(reply.content.keys()) == {records.GLOBAL, records.METRICS}
    metrics = evaluation.content[records.METRICS]
    assert set(metrics.keys()) == {"dice-global", "num-images", "num-empty"}
    assert 0.0 <= metrics["dice-global"] <= 1.0


def test_fedsm_extra_selector_round_and_evaluation_follow_the_k_plus_one_selector():
    # Prepare
    spec = _spec()
    context = Context(run_id=1, node_id=7, node_config={"partition-id": SITE}, state=RecordDict(),
                      run_config={**TINY, "strategy": "fedsm-extra"})
    segmentation = get_weights(spec.build_segmentation())
    selector = get_weights(Selector(spec.num_sites + 1, spec.selector_width))
    models = {
        records.GLOBAL: records.to_record(segmentation),
        records.PERSONALIZED: records.models_to_record([segmentation] * spec.num_sites),
    }

    # Execute
    trained = client.train(
        _message({**models, records.SELECTOR: records.to_record(selector),
                  records.SELECTOR_OPTIMIZER: records.to_record({}),
                  records.CONFIG: records.to_config({"server-round": 3, "phase": "selector"})}, MessageType.TRAIN),
        context,
    )
    evaluation = client.evaluate(
        _message({**models, records.SELECTOR: trained.content[records.SELECTOR],
                  records.CONFIG: records.to_config({"split": "val", "gamma": 0.0, "selector-includes-global": True})},
                 MessageType.EVALUATE),
        context,
    )

    # Assert
    new_selector = records.from_record(trained.content[records.SELECTOR])
    assert new_selector["classifier.weight"].shape[0] == spec.num_sites + 1
    assert any(not np.array_equal(new_selector[k], selector[k]) for k in selector)
    metrics = evaluation.content[records.METRICS]
    # every candidate is the same model, so whichever is chosen scores the same
    assert metrics["dice-super"] == pytest.approx(metrics["dice-global"])
    assert "dice-super-sweep" not in metrics


def test_query_for_needed_models_names_the_own_model_and_every_routed_one():
    # Prepare: a selector whose head always prefers site 4 (bias), on site 2's validation images
    spec = _spec()
    selector = spec.build_selector()
    weights = get_weights(selector)
    weights["classifier.bias"] = np.eye(spec.num_sites, dtype=np.float32)[4] * 1e3
    msg = _message(dict(encode_models_query(weights, "val")), MessageType.QUERY)

    # Execute
    reply = client.query(msg, _context())

    # Assert: its own model (dice-personal) and site 4's, where every image is routed
    assert decode_models_reply(reply.content, spec.num_sites) == sorted({SITE, 4})


def test_a_message_naming_a_state_key_keeps_the_site_state_under_that_run_key():
    # Prepare: a resumed run names its original run's key; the node's own run id is 1
    spec = _spec()
    segmentation, selector = get_weights(spec.build_segmentation()), get_weights(spec.build_selector())
    content = records.with_route(RecordDict({
        records.GLOBAL: records.to_record(segmentation), records.PERSONAL: records.to_record(segmentation),
        records.SELECTOR: records.to_record(selector), records.SELECTOR_OPTIMIZER: records.to_record({}),
        records.CONFIG: records.to_config({"server-round": 1})}),
        dataset_info("synthetic-fundus").site_names[SITE], state_key="first-run")

    # Execute
    client.train(Message(content, message_type=MessageType.TRAIN, dst_node_id=7), _context())

    # Assert
    site_name = dataset_info("synthetic-fundus").site_names[SITE]
    assert load_site_state("first-run", site_name, records.SELECTOR_MOMENTS_STATE) is not None
    assert load_site_state(1, site_name, records.SELECTOR_MOMENTS_STATE) is None
