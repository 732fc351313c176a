"""The FedSM ClientApp: one site's side of every round.

Handlers only decode the message, call ``fedsm_core`` and encode the reply.
"""

from __future__ import annotations

import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client_app import records
from client_app.site import resolve_site_index
from fedsm_core.algorithms.fedsm import FedSMPayload
from fedsm_core.algorithms.fedsm_client import TrainSettings, train_fedsm_client
from fedsm_core.algorithms.super_model import SuperModel
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.registry import DatasetInfo, dataset_info
from fedsm_core.data.statistics import channel_statistics
from fedsm_core.device import select_device, set_cpu_threads
from fedsm_core.evaluation import evaluate_super_model
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import set_weights

app = ClientApp()


def _setup(context: Context) -> tuple[RunConfig, DatasetInfo, int, torch.device]:
    config = RunConfig.from_mapping(context.run_config)
    set_cpu_threads(config.torch_threads)
    info = dataset_info(config.dataset)
    return config, info, resolve_site_index(context.node_config, info.site_names), select_device(config.device)


def _load_site(config: RunConfig, info: DatasetInfo, site_index: int) -> SiteSplits:
    return info.load_site(site_index, config.image_size, config.data_scale, config.data_seed)


def _spec(config: RunConfig, info: DatasetInfo) -> ModelSpec:
    return ModelSpec(config.encoder, len(info.structures), info.num_sites, config.selector_width, norm=config.segmentation_norm)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which site this node is, how much data it holds and its pixel statistics."""
    config, info, site_index, _ = _setup(context)
    site = _load_site(config, info, site_index)
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


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of FedSM's Algorithm 1 on the local training split."""
    config, info, site_index, device = _setup(context)
    site = _load_site(config, info, site_index)
    content = msg.content
    server_round = int(content[records.CONFIG]["server-round"])
    payload = FedSMPayload(
        global_weights=records.from_record(content[records.GLOBAL]),
        personal_weights=records.from_record(content[records.PERSONAL]),
        selector_weights=records.from_record(content[records.SELECTOR]),
        selector_optimizer=records.from_record(content[records.SELECTOR_OPTIMIZER]),
    )
    settings = TrainSettings(
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        max_local_steps=config.max_local_steps,
        lr=config.lr,
        selector_lr=config.selector_lr,
        seed=config.seed * 1_000_003 + server_round * 101 + site_index,
        selector_negatives=config.selector_negatives,
    )
    torch.manual_seed(settings.seed)
    update, metrics = train_fedsm_client(payload, site_index, site.train, _spec(config, info), settings, device)
    reply = RecordDict(
        {
            records.GLOBAL: records.to_record(update.global_weights),
            records.PERSONAL: records.to_record(update.personal_weights),
            records.SELECTOR: records.to_record(update.selector_weights),
            records.SELECTOR_OPTIMIZER: records.to_record(update.selector_optimizer),
            records.METRICS: records.to_metrics({**metrics, "num-examples": update.num_examples}),
        }
    )
    return Message(reply, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Dice of global, personalized and super model, and selector accuracy, on one split."""
    config, info, site_index, device = _setup(context)
    site = _load_site(config, info, site_index)
    content = msg.content
    split = str(content[records.CONFIG]["split"])
    if split not in ("val", "test"):
        raise ValueError(f"evaluate: split '{split}' is not 'val' or 'test'")
    spec = _spec(config, info)
    global_model = spec.build_segmentation()
    set_weights(global_model, records.from_record(content[records.GLOBAL]), "global model")
    personalized = []
    for index, weights in enumerate(records.models_from_record(content[records.PERSONALIZED], info.num_sites)):
        model = spec.build_segmentation()
        set_weights(model, weights, f"personalized model {index}")
        personalized.append(model)
    selector = spec.build_selector()
    set_weights(selector, records.from_record(content[records.SELECTOR]), "selector")
    gamma = float(content[records.CONFIG]["gamma"])
    super_model = SuperModel(global_model, personalized, selector, gamma)
    metrics = evaluate_super_model(super_model, site_index, getattr(site, split), config.batch_size * 2, device)
    return Message(RecordDict({records.METRICS: records.to_metrics(metrics)}), reply_to=msg)
