"""The FedSM ClientApp: one site's side of every round.

Handlers only decode the message, call ``fedsm_core`` and encode the reply.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from logging import INFO

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import log

from app_protocol import records
from app_protocol.evaluate_messages import (
    decode_evaluation,
    decode_models_query,
    decode_query,
    decode_statistics_query,
    encode_metrics,
    encode_models_reply,
    encode_node_reply,
    encode_site_reply,
    encode_statistics_reply,
)
from app_protocol.train_messages import (
    FINE_TUNE,
    TrainRequest,
    decode_fedsm_train,
    decode_personalized,
    decode_train,
    encode_fedsm_reply,
    encode_fine_tune_reply,
    encode_model_reply,
    encode_selector_reply,
)
from client_app.attacks import attacked_reply, site_attacks, with_flipped_labels
from client_app.fine_tuning import cross_fit_sweeps, fine_tune, kept_halves
from client_app.overlays import write_test_overlays
from client_app.site import node_data_paths, node_device, node_identity, site_of_message
from client_app.site_state import SiteFiles, load_site_state, save_site_state
from fedsm_core.algorithms.baselines.global_client import GlobalClientOptions, train_global_client
from fedsm_core.algorithms.fedsm.fedsm_extra import extra_spec, train_extra_selector_client
from fedsm_core.algorithms.fedsm.needed_models import needed_models
from fedsm_core.algorithms.fedsm.selector_head import selector_statistics
from fedsm_core.algorithms.fedsm.site_round import fedsm_site_round
from fedsm_core.algorithms.fedsm.super_model import SuperModel, assemble_super_model
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.registry import DatasetInfo, training_dataset
from fedsm_core.data.statistics import channel_statistics
from fedsm_core.device import configure_backends, describe_device, select_device, set_cpu_threads
from fedsm_core.evaluation.knn_per_evaluation import evaluate_knn_per_at_site
from fedsm_core.evaluation.super_model_evaluation import evaluate_model, evaluate_super_model
from fedsm_core.methods import METHODS, Method
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import set_weights
from fedsm_core.report.overlays import model_predictor, super_model_predictor
from fedsm_core.training.precision import resolve_precision

app = ClientApp()


def _setup(msg: Message, context: Context) -> tuple[RunConfig, DatasetInfo, int, torch.device]:
    config = RunConfig.from_mapping(context.run_config)
    set_cpu_threads(config.torch_threads)
    info = training_dataset(config.dataset, config.held_out_site, node_data_paths(context.node_config))
    route = msg.content[records.ROUTE] if records.ROUTE in msg.content else None  # read by site_of_message
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
    return config.model_spec(len(info.structures), info.num_sites)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Answer a query: who this node is, its site's size and statistics, or a selector's statistics.

    ``ask = node``: who this node is; ``ask = site`` (the default): a site's data size and pixel
    statistics; ``ask = selector-statistics``: the embedding statistics of a selector it is sent.
    """
    asked = decode_query(msg.content)
    if asked == records.ASK_NODE:
        return Message(encode_node_reply(node_identity(context.node_config)), reply_to=msg)
    if asked == records.SELECTOR_STATISTICS:
        return Message(selector_statistics_reply(msg, context), reply_to=msg)
    if asked == records.ASK_MODELS:
        return Message(needed_models_reply(msg, context), reply_to=msg)
    config, info, site_index, _ = _setup(msg, context)
    site = _load_site(config, context, site_index)
    pixels = channel_statistics(site.train.images)
    reply = encode_site_reply(
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
    return Message(reply, reply_to=msg)


def selector_statistics_reply(msg: Message, context: Context) -> RecordDict:
    """Sums of the received selector's embeddings of the training split, for fitting its head on the server."""
    config, info, site_index, device = _setup(msg, context)
    attacks = site_attacks(config.attack_settings, info.site_names[site_index], context.node_config)
    # fake-statistics: a malicious site reports the next site's statistics as its own
    source = (site_index + 1) % info.num_sites if "fake-statistics" in attacks else site_index
    site = _load_site(config, context, source)
    selector = _spec(config, info).build_selector()
    set_weights(selector, decode_statistics_query(msg.content), "selector")
    statistics = selector_statistics(selector, site.train, config.augmentation != "none", config.batch_size * 2,
                                     device)
    return encode_statistics_reply(statistics.to_arrays())


def needed_models_reply(msg: Message, context: Context) -> RecordDict:
    """The personalized models the received selector routes this site's split to, plus the site's own."""
    config, info, site_index, device = _setup(msg, context)
    site = _load_site(config, context, site_index)
    weights, split, includes_global = decode_models_query(msg.content)
    spec = _spec(config, info)
    selector = (extra_spec(spec) if includes_global else spec).build_selector()
    set_weights(selector, weights, "selector")
    return encode_models_reply(needed_models(selector, getattr(site, split), site_index, includes_global,
                                             config.batch_size * 2, device, config.fedsm_settings.route_by))


@dataclasses.dataclass(frozen=True)
class SiteJob:
    """One site's training job: the decoded message and everything the trainers need."""

    request: TrainRequest
    context: Context
    config: RunConfig
    spec: ModelSpec
    site: SiteSplits
    site_index: int
    settings: RoundSettings
    device: torch.device

    @property
    def state_key(self) -> str:
        """Which run's per-site state this job reads and writes (the server's key, else the run id)."""
        return self.request.state_key or str(self.context.run_id)

    @property
    def method(self) -> Method:
        """The run's row of the table of methods."""
        return METHODS[self.config.strategy]


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training for the run's method."""
    began = time.perf_counter()
    config, info, site_index, device = _setup(msg, context)
    request = decode_train(msg.content)
    settings = config.round_settings(request.server_round, site_index)
    torch.manual_seed(settings.seed)
    site = _load_site(config, context, site_index)
    attacks = site_attacks(config.attack_settings, site.name, context.node_config)  # simulation only
    if "label-flip" in attacks:
        site = with_flipped_labels(site)
    job = SiteJob(request, context, config, _spec(config, info), site, site_index, settings, device)
    content = SITE_ROUNDS[job.method.site_round](job)
    if attacks:
        content = attacked_reply(content, request.weights, attacks, config.attack_scale, settings.seed)
    # The site's own time, which the server sets against the exchange's wall time (timing.csv)
    content[records.METRICS][records.SITE_SECONDS] = time.perf_counter() - began
    return Message(content, reply_to=msg)


def train_fedsm(job: SiteJob) -> RecordDict:
    """FedSM's Algorithm 1 on the local training split; after the last round (phase ``fine-tune``), fine-tuning."""
    if job.request.phase == FINE_TUNE:
        return fine_tune_site(job)
    return _fedsm_round(job, job.settings)


def fine_tune_site(job: SiteJob) -> RecordDict:
    """The final global model fine-tuned on the training split, the pass chosen on validation (``fine-tune-passes``)."""
    settings = dataclasses.replace(job.settings, lr=job.config.lr)  # the base lr, whatever the schedule reached
    tuned = fine_tune(job.config, job.spec, job.request.weights[records.GLOBAL], job.site, settings, job.device,
                      job.state_key)
    return encode_fine_tune_reply(tuned.weights, tuned.passes, tuned.curve, len(job.site.train.images))


def train_fedsm_extra(job: SiteJob) -> RecordDict:
    """FedSM-extra: FedSM's models with the selector frozen, then (phase ``selector``) its K + 1 selector."""
    if job.request.phase == "selector":
        return train_extra_selector(job)
    return _fedsm_round(job, dataclasses.replace(job.settings, train_selector=False))


def _fedsm_round(job: SiteJob, settings: RoundSettings) -> RecordDict:
    memory = SiteFiles(job.state_key, job.site.name)  # what this site keeps between rounds, on its disk
    update, metrics = fedsm_site_round(decode_fedsm_train(job.request), job.site_index, job.site.train, job.spec,
                                       settings, job.device, job.config.kept_state, memory)
    return encode_fedsm_reply(update, metrics)


def train_extra_selector(job: SiteJob) -> RecordDict:
    """FedSM-extra's extra round: train the K + 1-output selector toward each image's best model."""
    weights, moments, metrics = train_extra_selector_client(
        job.request.weights[records.GLOBAL], decode_personalized(job.request, job.spec.num_sites),
        job.request.weights[records.SELECTOR], job.request.weights[records.SELECTOR_OPTIMIZER],
        job.site.train, job.spec, job.settings, job.device,
    )
    return encode_selector_reply(weights, moments, metrics, len(job.site.train.images))


def train_single_model(job: SiteJob) -> RecordDict:
    """FedAvg, FedProx, HarmoFL, SCAFFOLD or FedBN local training of one model.

    SCAFFOLD's client control variate ``c_k``, and Adam's state under
    ``optimizer-state = local``, stay at the site from one round to the next,
    stored per site (:mod:`client_app.site_state`).
    """
    server_control = job.request.weights.get(records.SERVER_CONTROL)
    client_control = None
    if server_control is not None:
        stored = load_site_state(job.state_key, job.site.name, records.CLIENT_CONTROL_STATE)
        client_control = stored if stored is not None else {
            key: np.zeros_like(value) for key, value in server_control.items()
        }
    kept = None
    if job.config.optimizer_state == "local":  # this site's Adam state from its previous round, never sent
        kept = load_site_state(job.state_key, job.site.name, records.OPTIMIZER_STATE) or {}
    elif job.config.optimizer_state == "averaged":  # the server's average of the sites' states of last round
        kept = job.request.weights[records.OPTIMIZER_STATE]
    options = GlobalClientOptions(
        proximal_mu=job.config.proximal_mu if job.method.adds("proximal") else 0.0,
        server_control=server_control,
        client_control=client_control,
        optimizer_state=kept,
    )
    update, metrics = train_global_client(job.request.weights[records.GLOBAL], job.site.train, job.spec,
                                          job.settings, options, job.device)
    if update.optimizer_state is not None and job.config.optimizer_state == "local":
        save_site_state(job.state_key, job.site.name, records.OPTIMIZER_STATE, update.optimizer_state)
    delta = None
    if update.client_control is not None and client_control is not None:
        delta = {key: update.client_control[key] - client_control[key] for key in client_control}
        save_site_state(job.state_key, job.site.name, records.CLIENT_CONTROL_STATE, update.client_control)
    averaged = update.optimizer_state if job.config.optimizer_state == "averaged" else None
    return encode_model_reply(update.weights, metrics, update.num_examples, delta, averaged)


# What a site runs each round, by the method's ``site_round`` (fedsm_core.methods.SITE_ROUNDS)
SITE_ROUNDS = {"single-model": train_single_model, "fedsm": train_fedsm, "fedsm-extra": train_fedsm_extra}


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Dice on one split: of the global model, or of the whole FedSM super model routed by ``route-by``.

    Where the split's ids name cases, the reply also carries the per-case scores
    (:mod:`fedsm_core.evaluation.case_scores`).
    """
    config, info, site_index, device = _setup(msg, context)
    site = _load_site(config, context, site_index)
    request = decode_evaluation(msg.content, info.num_sites)
    spec = _spec(config, info)
    data = getattr(site, request.split)
    if request.super_model is None:
        model = spec.load_segmentation(request.global_weights, "global model")
        knn = knn_metrics(config, model, site, device) if request.split == "test" and config.knn_per else {}
        metrics = evaluate_model(model, data, config.batch_size * 2, device)
        write_test_overlays(model_predictor(model), data, site.name, request.overlay_dir, context, device)
        return Message(encode_metrics({**metrics, **knn}), reply_to=msg)
    weights = request.super_model
    super_model = assemble_super_model(spec, request.global_weights, weights.personalized, weights.selector,
                                       weights.gamma, weights.selector_includes_global, info.site_names)
    metrics = evaluate_super_model(super_model, site_index, data, config.batch_size * 2, device,
                                   list(weights.gamma_sweep), routing=request.split == "test",
                                   route_by=config.fedsm_settings.route_by)
    halves = kept_halves(records.decode_state_key(msg.content) or str(context.run_id), site.name,
                         weights.personalized[site_index]) if request.split == "val" and weights.gamma_sweep else None
    if halves is not None:  # fine-tune-gamma = "cross-fit": the sweeps that choose gamma, cross-fitted
        metrics = cross_fit_sweeps(metrics, super_model, spec, site, site_index, halves, config.batch_size * 2,
                                   device, list(weights.gamma_sweep), config.fedsm_settings.route_by)
    predictor = super_model_predictor(super_model, info.site_names, config.fedsm_settings.route_by,
                                      config.batch_size * 2)
    write_test_overlays(predictor, data, site.name, request.overlay_dir, context, device)
    knn = knn_metrics(config, super_model.global_model, site, device, super_model) \
        if request.split == "test" and config.knn_per else {}
    return Message(encode_metrics({**metrics, **knn}), reply_to=msg)


def knn_metrics(config: RunConfig, global_model: torch.nn.Module, site: SiteSplits, device: torch.device,
                super_model: SuperModel | None = None) -> dict[str, float]:
    """kNN-Per on the global model: datastore from the training split, lam from validation, test Dice.

    With FedSM's ``super_model``, also kNN-Per on each image's routed model
    (``dice-super-knn``, :mod:`fedsm_core.algorithms.fedsm.routed_knn_per`).
    """
    return evaluate_knn_per_at_site(global_model, site.train, site.val, site.test, config.knn_settings, device,
                                    super_model)
