"""The in-process loop runs exactly what the app runs, bit for bit: one round, or two where sites keep state."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, Message, MessageType, RecordDict

from app_protocol.evaluate_messages import decode_metrics, encode_super_model_evaluation
from app_protocol.records import METRICS, PERSONAL, from_record, with_route
from app_protocol.train_messages import encode_fine_tune
from client_app import app as client
from experiments import in_process
from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import training_dataset
from fedsm_core.data.statistics import channel_statistics
from server_app.discovery import SiteNode
from server_app.strategies.builder import Setup, build_strategy

TINY = {"num-server-rounds": 1, "image-size": 32, "data-scale": 0.1, "max-local-steps": 2, "selector-width": 4,
        "batch-size": 4}


pytestmark = [pytest.mark.usefixtures("client_process"), pytest.mark.long_module(seconds=40)]


def _app_rounds(settings: dict[str, object], rounds: int):
    """FedSM rounds: the strategy's messages, each answered by the ClientApp's handler, then aggregation."""
    config = RunConfig.from_mapping(settings)
    federation = in_process.prepare(config)  # only for the data, spec and dataset info it loaded
    nodes = [SiteNode(100 + index, index, site.name, len(site.train), len(site.val), len(site.test),
                      channel_statistics(site.train.images)) for index, site in enumerate(federation.sites)]
    info = training_dataset(config.dataset, config.held_out_site)
    strategy, _ = build_strategy(Setup(config, info, federation.spec, nodes, lambda *args: None))
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config=settings)
    for server_round in range(1, rounds + 1):
        messages = list(strategy.configure_train(server_round))
        replies = [client.train(message, context) for message in messages]  # each site's node answers for it
        strategy.aggregate_train(server_round, replies)
    return strategy.fedsm


@pytest.mark.parametrize(("extra", "rounds"), [
    ({}, 1),
    # Everything a site or the server keeps or changes between rounds, at once: HarmoFL's amplitude (fixed
    # after round 1), what APFL keeps at each site, the server's averaged selector moments, the server's
    # Adam and FedNova's steps (which travel in replies), and each site's own Adam states
    ({"amplitude-normalization": True, "personalization": "apfl", "selector-moments": "averaged",
      "server-optimizer": "adam", "server-lr": 0.01, "step-normalization": "fednova", "aggregation": "mean",
      "optimizer-state": "local",
      "style-augmentation": 0.5}, 2),
], ids=["defaults", "kept-and-changed-state"])
def test_the_in_process_loop_equals_the_apps_round_for_round(extra, rounds):
    # Prepare
    settings = {**TINY, "num-server-rounds": rounds, **extra}

    # Execute
    federation = in_process.prepare(RunConfig.from_mapping(settings))
    start = {key: value.copy() for key, value in federation.fedsm.global_weights.items()}
    for server_round in range(1, rounds + 1):
        in_process.train_round(federation, server_round)
    app = _app_rounds(settings, rounds)

    # Assert: the same start state, seeds, training and aggregation give identical weights
    loop = federation.fedsm
    for name, mine, theirs in [("global", loop.global_weights, app.global_weights),
                               ("selector", loop.selector_weights, app.selector_weights),
                               *[(f"personalized {site}", loop.personalized[site], app.personalized[site])
                                 for site in loop.site_names]]:
        assert mine.keys() == theirs.keys(), name
        for key in mine:
            np.testing.assert_array_equal(mine[key], theirs[key], err_msg=f"{name}: {key}")
    assert any(not np.array_equal(federation.fedsm.global_weights[k], v) for k, v in start.items())  # it trained


def test_the_loop_refuses_what_it_does_not_run():
    with pytest.raises(ValueError, match="strategy = 'fedavg'.*FedSM only"):
        in_process.prepare(RunConfig.from_mapping({**TINY, "strategy": "fedavg"}))


def test_the_loops_final_fine_tuning_equals_the_apps_bit_for_bit():
    # Prepare: one round in the loop (the app's round gives the same global model, as the test above shows)
    settings = {**TINY, "fine-tune-passes": 2}
    federation = in_process.prepare(RunConfig.from_mapping(settings))
    in_process.train_round(federation, 1)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config=settings)
    # the request the strategy sends each site after round 1 (server_app/strategies/fine_tuning.py), made
    # before the loop's fine-tuning replaces the personalized models
    request = encode_fine_tune(federation.fedsm.global_weights, 2)

    # Execute
    tuned = in_process.fine_tune(federation, 2)
    replies = {site.name: client.train(Message(with_route(request, site.name), message_type=MessageType.TRAIN,
                                               dst_node_id=7), context)
               for site in federation.sites}

    # Assert: every site kept the same pass and the same weights either way (some moved off the global model)
    assert any(result.passes > 0 for result in tuned.values())
    for site, reply in replies.items():
        assert int(reply.content[METRICS]["fine-tune-passes"]) == tuned[site].passes, site
        theirs = from_record(reply.content[PERSONAL])
        for key, value in federation.fedsm.personalized[site].items():
            np.testing.assert_array_equal(value, theirs[key], err_msg=f"{site}: {key}")


def test_the_loops_cross_fitted_validation_equals_the_apps():
    # Prepare: one round and the final fine-tuning (fine-tune-gamma = "cross-fit", the default) in the loop, and
    # the same fine-tuning requests answered by the app's handler, which keeps each site's halves on its disk
    settings = {**TINY, "fine-tune-passes": 4, "lr": 0.02}
    federation = in_process.prepare(RunConfig.from_mapping(settings))
    in_process.train_round(federation, 1)
    softpull = dict(federation.fedsm.personalized)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config=settings)
    for site in federation.sites:
        client.train(Message(with_route(encode_fine_tune(federation.fedsm.global_weights, 2), site.name),
                             message_type=MessageType.TRAIN, dst_node_id=7), context)
    halves = in_process.fine_tune_as_run(federation)
    in_process.fit_selector_head(federation)
    fedsm = federation.fedsm

    def app_sweeps(personalized: dict) -> dict[str, list[float]]:
        """Each site's validation sweep as the ClientApp reports it for a super model with ``personalized``."""
        content = encode_super_model_evaluation(fedsm.global_weights, [personalized[s] for s in fedsm.site_names],
                                                fedsm.selector_weights, "val", 0.5, GAMMA_GRID)
        return {site.name: decode_metrics(client.evaluate(Message(
            with_route(content, site.name), message_type=MessageType.EVALUATE, dst_node_id=7), context).content)[1][
            "dice-super-sweep"] for site in federation.sites}

    # Execute
    plain = in_process.evaluate(federation, "val", 0.5)
    loop = in_process.cross_fit_validation(federation, plain, halves)
    tuned = app_sweeps(fedsm.personalized)
    fedsm.personalized.update(softpull)
    other = app_sweeps(softpull)

    # Assert: with the fine-tuned models it replied with, each site's sweep is the loop's cross-fitted one; with
    # any other personalized model (SoftPull's) it is the plain sweep of the models sent
    assert halves and set(halves) <= {site.name for site in federation.sites}
    # (at lr 0.02 site-3's halves keep passes 3 and 4, so its cross-fitted sweep is not the plain one)
    assert any(loop[name]["dice-super-sweep"] != pytest.approx(plain[name]["dice-super-sweep"], abs=1e-6)
               for name in halves)
    for site in federation.sites:
        assert tuned[site.name] == pytest.approx(loop[site.name]["dice-super-sweep"], abs=1e-6), site.name
    fedsm.personalized.update(softpull)
    unrouted = in_process.evaluate(federation, "val", 0.5)
    for site in federation.sites:
        assert other[site.name] == pytest.approx(unrouted[site.name]["dice-super-sweep"], abs=1e-6), site.name
