"""The FedSM ClientApp: one site's side of every round.

Handlers only decode the message, call ``fedsm_core`` and encode the reply.
"""

from __future__ import annotations

import dataclasses
import functools
from logging import INFO

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import log

from client_app import records
from client_app.site import node_data_paths, node_device, node_identity, site_of_message
from client_app.site_state import load_site_state, save_site_state
from fedsm_core.algorithms.fedsm import FedSMPayload
from fedsm_core.algorithms.fedsm_client import round_settings, train_fedsm_client
from fedsm_core.algorithms.fedsm_extra import extra_spec, train_extra_selector_client
from fedsm_core.algorithms.global_client import GlobalClientOptions, train_global_client
from fedsm_core.algorithms.knn_per import evaluate_knn_per
from fedsm_core.algorithms.knn_per_settings import KNNPerSettings
from fedsm_core.algorithms.selector_head import selector_statistics
from fedsm_core.algorithms.super_model import SuperModel
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.registry import DatasetInfo, training_dataset
from fedsm_core.data.statistics import channel_statistics
from fedsm_core.device import configure_backends, describe_device, select_device, set_cpu_threads
from fedsm_core.evaluation import evaluate_model, evaluate_super_model
from fedsm_core.models.spec import ModelSpec, run_model_spec
from fedsm_core.models.weights import set_weights
from fedsm_core.training.precision import resolve_precision

app = ClientApp()


def _setup(msg: Message, context: Context) -> tuple[RunConfig, DatasetInfo, int, torch.device]:
    config = RunConfig.from_mapping(context.run_config)
    set_cpu_threads(config.torch_threads)
    info = training_dataset(config.dataset, config.held_out_site, node_data_paths(context.node_config))
    route = msg.content[records.ROUTE] if records.ROUTE in msg.content else None
    site_index = site_of_message(route, context.node_config, info.site_names)
    device = select_device(node_device(context.node_config, config.device))
    precision = resolve_precision(config.precision, device)
    configure_backends(device, config.deterministic, precision)
    _log_device_once(context, info.site_names[site_index], device, precision)
    return config, info, site_index, device


def _log_device_once(context: Context, site: str, device: torch.device, precision: str) -> None:
    """Log, once per run and node, where this site trains (the node's state outlives each message)."""
    if records.DEVICE_STATE in context.state:
        return
    line = describe_device(device, precision)
    context.state[records.DEVICE_STATE] = ConfigRecord({"device": line})
    log(INFO, "site %s trains on %s", site, line)


def _load_site(config: RunConfig, context: Context, site_index: int) -> SiteSplits:
    paths = tuple(sorted(node_data_paths(context.node_config).items()))
    return _cached_site(config.dataset, config.held_out_site, paths, site_index, config.image_size,
                        config.data_scale, config.data_seed)


@functools.lru_cache(maxsize=64)
def _cached_site(dataset: str, held_out: str, paths: tuple[tuple[str, str], ...], index: int, size: int,
                 scale: float, seed: int) -> SiteSplits:
    # A worker process serves many messages of every site (a Ray actor is not tied to one node):
    # keep all of them, so no site is read or generated twice. A 128 px site of 200 images is ~40 MB.
    return training_dataset(dataset, held_out, dict(paths)).load_site(index, size, scale, seed)


def _spec(config: RunConfig, info: DatasetInfo) -> ModelSpec:
    return run_model_spec(config, len(info.structures), info.num_sites)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Who this node is (``ask = node``), a site's data size and pixel statistics (``ask = site``, the
    default), or the embedding statistics of a selector it is sent (``ask = selector-statistics``)."""
    asked = str(msg.content[records.CONFIG].get(records.ASK, records.ASK_SITE)) if records.CONFIG in msg.content \
        else records.ASK_SITE
    if asked == records.ASK_NODE:
        return Message(RecordDict({records.NODE: records.to_config(node_identity(context.node_config))}),
                       reply_to=msg)
    if asked == records.SELECTOR_STATISTICS:
        return Message(selector_statistics_reply(msg, context), reply_to=msg)
    if asked != records.ASK_SITE:
        raise ValueError(f"query: unknown ask '{asked}'; expected '{records.ASK_NODE}', '{records.ASK_SITE}' or "
                         f"'{records.SELECTOR_STATISTICS}'")
    config, info, site_index, _ = _setup(msg, context)
    site = _load_site(config, context, site_index)
    pixels = channel_statistics(site.train.images)
    reply = records.to_config(
        {
            "site-index": site_index,
            "site-name": info.site_names[site_index],
            "num-train": len(site.train.images),
            "num-val": len(site.val.images),
            "num-test": len(site.test.images),
            "pixel-count": pixels.count,
            "pixel-mean": list(pixels.mean),
            "pixel-var": list(pixels.var),
        }
    )
    return Message(RecordDict({records.SITE: reply}), reply_to=msg)


def selector_statistics_reply(msg: Message, context: Context) -> RecordDict:
    """Sums of the received selector's embeddings of the training split, for fitting its head on the server."""
    content = msg.content
    config, info, site_index, device = _setup(msg, context)
    site = _load_site(config, context, site_index)
    selector = _spec(config, info).build_selector()
    set_weights(selector, records.from_record(content[records.SELECTOR]), "selector")
    statistics = selector_statistics(selector, site.train, config.augmentation != "none", config.batch_size * 2,
                                     device)
    return RecordDict({records.SELECTOR_STATISTICS: records.to_record(statistics.to_arrays())})


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training for the run's strategy."""
    config, info, site_index, device = _setup(msg, context)
    site = _load_site(config, context, site_index)
    settings = round_settings(config, int(msg.content[records.CONFIG]["server-round"]), site_index)
    torch.manual_seed(settings.seed)
    phase = str(msg.content[records.CONFIG].get("phase", ""))
    if phase == "selector":
        trainer = train_extra_selector
    elif config.strategy in ("fedsm", "fedsm-extra"):
        trainer = train_fedsm
    else:
        trainer = train_single_model
    reply = trainer(msg.content, context, config, _spec(config, info), site, site_index, settings, device)
    return Message(reply, reply_to=msg)


def train_fedsm(content, context, config, spec, site, site_index, settings, device) -> RecordDict:
    """FedSM's Algorithm 1 on the local training split."""
    payload = FedSMPayload(
        global_weights=records.from_record(content[records.GLOBAL]),
        personal_weights=records.from_record(content[records.PERSONAL]),
        selector_weights=records.from_record(content[records.SELECTOR]),
        selector_optimizer=records.from_record(content[records.SELECTOR_OPTIMIZER]),
    )
    if config.strategy == "fedsm-extra":  # its selector is trained only in the extra rounds
        settings = dataclasses.replace(settings, train_selector=False)
    # APFL's v_k and alpha_k stay at the site, per site (client_app.site_state)
    client_state = load_site_state(context.run_id, site.name, records.PERSONAL_STATE) or {}
    update, metrics = train_fedsm_client(payload, site_index, site.train, spec, settings, device, client_state)
    if update.client_state:
        save_site_state(context.run_id, site.name, records.PERSONAL_STATE, update.client_state)
    return RecordDict(
        {
            records.GLOBAL: records.to_record(update.global_weights),
            records.PERSONAL: records.to_record(update.personal_weights),
            records.SELECTOR: records.to_record(update.selector_weights),
            records.SELECTOR_OPTIMIZER: records.to_record(update.selector_optimizer),
            records.METRICS: records.to_metrics({**metrics, "num-examples": update.num_examples}),
        }
    )


def train_extra_selector(content, context, config, spec, site, site_index, settings, device) -> RecordDict:
    """FedSM-extra's extra round: train the K + 1-output selector toward each image's best model."""
    weights, moments, metrics = train_extra_selector_client(
        records.from_record(content[records.GLOBAL]),
        records.models_from_record(content[records.PERSONALIZED], spec.num_sites),
        records.from_record(content[records.SELECTOR]),
        records.from_record(content[records.SELECTOR_OPTIMIZER]),
        site.train, spec, settings, device,
    )
    return RecordDict(
        {
            records.SELECTOR: records.to_record(weights),
            records.SELECTOR_OPTIMIZER: records.to_record(moments),
            records.METRICS: records.to_metrics({**metrics, "num-examples": len(site.train.images)}),
        }
    )


def train_single_model(content, context, config, spec, site, site_index, settings, device) -> RecordDict:
    """FedAvg, FedProx or SCAFFOLD local training of the global model.

    SCAFFOLD's client control variate ``c_k`` stays at the site from one
    round to the next, stored per site (:mod:`client_app.site_state`).
    """
    server_control = client_control = None
    if records.SERVER_CONTROL in content:
        server_control = records.from_record(content[records.SERVER_CONTROL])
        stored = load_site_state(context.run_id, site.name, records.CLIENT_CONTROL_STATE)
        client_control = stored if stored is not None else {
            key: np.zeros_like(value) for key, value in server_control.items()
        }
    options = GlobalClientOptions(
        proximal_mu=config.proximal_mu if config.strategy == "fedprox" else 0.0,
        server_control=server_control,
        client_control=client_control,
    )
    update, metrics = train_global_client(
        records.from_record(content[records.GLOBAL]), site.train, spec, settings, options, device
    )
    reply = RecordDict(
        {
            records.GLOBAL: records.to_record(update.weights),
            records.METRICS: records.to_metrics({**metrics, "num-examples": update.num_examples}),
        }
    )
    if update.client_control is not None and client_control is not None:
        delta = {key: update.client_control[key] - client_control[key] for key in client_control}
        save_site_state(context.run_id, site.name, records.CLIENT_CONTROL_STATE, update.client_control)
        reply[records.CONTROL_DELTA] = records.to_record(delta)
    return reply


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Dice on one split: of the global model, or of the whole FedSM super model."""
    config, info, site_index, device = _setup(msg, context)
    site = _load_site(config, context, site_index)
    content = msg.content
    split = str(content[records.CONFIG]["split"])
    if split not in ("val", "test"):
        raise ValueError(f"evaluate: split '{split}' is not 'val' or 'test'")
    spec = _spec(config, info)
    global_model = spec.build_segmentation()
    set_weights(global_model, records.from_record(content[records.GLOBAL]), "global model")
    data = getattr(site, split)
    knn = knn_metrics(config, global_model, site, device) if split == "test" and config.knn_per else {}
    if records.PERSONALIZED not in content:
        metrics = evaluate_model(global_model, data, config.batch_size * 2, device)
        return Message(RecordDict({records.METRICS: records.to_metrics({**metrics, **knn})}), reply_to=msg)
    personalized = []
    for index, weights in enumerate(records.models_from_record(content[records.PERSONALIZED], info.num_sites)):
        model = spec.build_segmentation()
        set_weights(model, weights, f"personalized model {index}")
        personalized.append(model)
    includes_global = bool(content[records.CONFIG].get("selector-includes-global", False))
    selector = (extra_spec(spec) if includes_global else spec).build_selector()
    set_weights(selector, records.from_record(content[records.SELECTOR]), "selector")
    gamma = content[records.CONFIG]["gamma"]  # one threshold, or one per personalized model
    super_model = SuperModel(global_model, personalized, selector,
                             tuple(gamma) if isinstance(gamma, list) else float(gamma), includes_global)
    gammas = [float(g) for g in content[records.CONFIG].get("gamma-sweep", [])]
    metrics = evaluate_super_model(super_model, site_index, data, config.batch_size * 2, device, gammas)
    return Message(RecordDict({records.METRICS: records.to_metrics({**metrics, **knn})}), reply_to=msg)


def knn_metrics(config: RunConfig, global_model: torch.nn.Module, site: SiteSplits,
                device: torch.device) -> dict[str, float]:
    """kNN-Per on the global model: datastore from the training split, lam from validation, test Dice."""
    settings = KNNPerSettings(k=config.knn_k, kernel_scale=config.knn_kernel_scale, capacity=config.knn_capacity,
                              pixels_per_image=config.knn_pixels_per_image, seed=config.seed)
    return evaluate_knn_per(global_model, site.train, site.val, site.test, settings, device)
