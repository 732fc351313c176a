"""The FedSM ClientApp with a personalization method: APFL's v_k and alpha_k stay in the site's state."""

from __future__ import annotations

from flwr.app import Context, Message, MessageType, RecordDict

from app_protocol import records
from client_app import app as client
from client_app.site_state import load_site_state
from fedsm_core.algorithms.personalization.apfl import ALPHA_KEY, LOCAL_PREFIX
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import dataset_info
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights

TINY = {"image-size": 32, "data-scale": 0.1, "max-local-steps": 1, "selector-width": 4, "batch-size": 4}
SITE = 2
SITE_NAME = dataset_info("synthetic-fundus").site_names[SITE]


def _train_message(spec: ModelSpec) -> Message:
    segmentation, selector = get_weights(spec.build_segmentation()), get_weights(spec.build_selector())
    content = {
        records.GLOBAL: records.to_record(segmentation),
        records.PERSONAL: records.to_record(segmentation),
        records.SELECTOR: records.to_record(selector),
        records.SELECTOR_OPTIMIZER: records.to_record({}),
        records.CONFIG: records.to_config({"server-round": 1}),
    }
    return Message(RecordDict(content), message_type=MessageType.TRAIN, dst_node_id=7)


def _spec(run_config: dict) -> ModelSpec:
    config = RunConfig.from_mapping(run_config)
    info = dataset_info(config.dataset)
    return config.model_spec(len(info.structures), info.num_sites)


def test_apfl_keeps_its_local_model_and_alpha_on_the_node_and_resumes_from_them():
    # Prepare: alpha learned fast enough to leave 0.5 after one step
    run_config = {**TINY, "personalization": "apfl", "apfl-alpha-lr": 1.0}
    context = Context(run_id=1, node_id=7, node_config={"partition-id": SITE}, state=RecordDict(),
                      run_config=run_config)
    spec = _spec(run_config)

    # Execute
    reply = client.train(_train_message(spec), context)
    first = load_site_state(1, SITE_NAME, records.PERSONAL_STATE)
    frozen = {**run_config, "apfl-alpha": 0.9, "apfl-alpha-lr": 0.0}  # round 2 must not restart at apfl-alpha
    client.train(_train_message(spec), Context(run_id=1, node_id=7, node_config={"partition-id": SITE},
                                               state=context.state, run_config=frozen))
    second = load_site_state(1, SITE_NAME, records.PERSONAL_STATE)

    # Assert: the reply is the deployed mixture (U-Net layout); the state holds v_k and alpha_k, and round 2
    # continued from round 1's alpha (kept fixed there) rather than restarting at apfl-alpha
    assert set(records.from_record(reply.content[records.PERSONAL])) == set(get_weights(spec.build_segmentation()))
    assert {key for key in first if not key.startswith(LOCAL_PREFIX)} == {ALPHA_KEY}
    assert float(first[ALPHA_KEY]) != 0.5
    assert float(second[ALPHA_KEY]) == float(first[ALPHA_KEY])


def test_softpull_leaves_no_site_state():
    # Prepare
    context = Context(run_id=1, node_id=7, node_config={"partition-id": SITE}, state=RecordDict(), run_config=TINY)

    # Execute
    client.train(_train_message(_spec(TINY)), context)

    # Assert
    assert records.PERSONAL_STATE not in context.state
    assert load_site_state(1, SITE_NAME, records.PERSONAL_STATE) is None
