"""The ClientApp routes by the run's ``route-by``: in its evaluation and in its answer to the needed-models query."""

from __future__ import annotations

from flwr.app import Context, Message, MessageType, RecordDict

from app_protocol import records
from app_protocol.evaluate_messages import encode_models_query
from client_app import app as client
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import dataset_info
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights

TINY = {"image-size": 32, "data-scale": 0.1, "max-local-steps": 1, "selector-width": 4, "batch-size": 4,
        "route-by": "case"}


def _context() -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": 2}, state=RecordDict(), run_config=TINY)


def _spec() -> ModelSpec:
    config = RunConfig.from_mapping(TINY)
    info = dataset_info(config.dataset)
    return config.model_spec(len(info.structures), info.num_sites)


def test_the_evaluation_routes_by_the_run_configs_route_by(monkeypatch):
    # Prepare: record what the evaluation is asked
    seen = {}

    def evaluate(*args, **kwargs):
        seen.update(kwargs)
        return {"dice-global": 0.5, "num-images": 1.0}

    monkeypatch.setattr(client, "evaluate_super_model", evaluate)
    spec = _spec()
    segmentation = get_weights(spec.build_segmentation())
    msg = Message(RecordDict({
        records.GLOBAL: records.to_record(segmentation),
        records.PERSONALIZED: records.models_to_record([segmentation] * spec.num_sites),
        records.SELECTOR: records.to_record(get_weights(spec.build_selector())),
        records.CONFIG: records.to_config({"split": "val", "gamma": 0.5}),
    }), message_type=MessageType.EVALUATE, dst_node_id=7)

    # Execute
    client.evaluate(msg, _context())

    # Assert
    assert seen["route_by"] == "case"


def test_the_needed_models_follow_the_run_configs_route_by(monkeypatch):
    # Prepare
    seen = []
    monkeypatch.setattr(client, "needed_models", lambda *args: seen.append(args[-1]) or [2])
    msg = Message(RecordDict(dict(encode_models_query(get_weights(_spec().build_selector()), "val"))),
                  message_type=MessageType.QUERY, dst_node_id=7)

    # Execute
    client.query(msg, _context())

    # Assert
    assert seen == ["case"]
