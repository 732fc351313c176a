"""FedSM without Flower: the same rounds as the app, as a plain loop in this process.

It composes the core functions the ServerApp and ClientApp call
(:class:`~fedsm_core.algorithms.fedsm.fedsm.FedSM`,
:func:`~fedsm_core.algorithms.fedsm.site_round.fedsm_site_round` (the ClientApp's own site round),
:func:`~fedsm_core.evaluation.super_model_evaluation.evaluate_super_model`) with the same data, model
initialisation, per-(round, site) seeds
(:func:`~fedsm_core.algorithms.fedsm.client.round_settings`), validation
schedule (every ``eval-every`` rounds and the last), gamma chosen on validation
and final test evaluation. What is left out is exactly what Flower adds:
messages, serialization, the SuperLink, Ray workers and process start-up. It is
the baseline of the framework-overhead benchmark (:mod:`experiments.bench.run_bench`).
"""

from __future__ import annotations

import dataclasses
import resource
import time

import torch

from fedsm_core.algorithms.baselines.harmofl import AmplitudeSchedule
from fedsm_core.algorithms.fedsm.fedsm import FedSM, FedSMUpdate
from fedsm_core.algorithms.fedsm.final_fine_tuning import FineTuned, fine_tune_on_splits
from fedsm_core.algorithms.fedsm.gamma import GAMMA_GRID, select_gamma
from fedsm_core.algorithms.fedsm.selector_head import selector_statistics
from fedsm_core.algorithms.fedsm.site_round import DictMemory, fedsm_site_round
from fedsm_core.algorithms.fedsm.super_model import Gamma, SuperModel, assemble_super_model
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SegArrays, SiteSplits
from fedsm_core.data.registry import training_dataset
from fedsm_core.data.statistics import channel_statistics
from fedsm_core.device import configure_backends, select_device, set_cpu_threads
from fedsm_core.evaluation.cross_fit import can_cross_fit, halve_by_case, with_cross_fitted_sweeps
from fedsm_core.evaluation.super_model_evaluation import evaluate_super_model
from fedsm_core.methods import METHODS
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import set_weights
from fedsm_core.run_files.run_outputs import pool_site_metrics
from fedsm_core.training.precision import resolve_precision


@dataclasses.dataclass
class Federation:
    """Everything the loop needs: run settings, sites' data, models' spec, server state, device."""

    config: RunConfig
    sites: list[SiteSplits]
    spec: ModelSpec
    fedsm: FedSM
    device: torch.device
    # What each site keeps between rounds (fedsm_core.algorithms.fedsm.site_round), as the ClientApp keeps it on disk
    memories: dict[str, DictMemory] = dataclasses.field(default_factory=dict)


def _clock(device: torch.device) -> float:
    """Wall time after the device's queued work has finished (CUDA kernels run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.monotonic()


def prepare(config: RunConfig) -> Federation:
    """Load every site and initialise the super model as the ServerApp does.

    The U-Net is initialised under ``torch.manual_seed(seed)``; the selector's
    input statistics are the pooled pixel statistics of the training splits.
    """
    if METHODS[config.strategy].family != "fedsm" or METHODS[config.strategy].extra_selector:
        raise ValueError(f"strategy = '{config.strategy}': the in-process loop runs FedSM only; use strategy 'fedsm'")
    set_cpu_threads(config.torch_threads)
    info = training_dataset(config.dataset, config.held_out_site)
    sites = [info.load_site(i, config.image_size, config.data_scale, config.data_seed) for i in range(info.num_sites)]
    spec = config.model_spec(len(info.structures), info.num_sites)
    fedsm, _ = config.start_fedsm(spec, info.site_names, [channel_statistics(site.train.images) for site in sites])
    device = select_device(config.device)
    configure_backends(device, config.deterministic, resolve_precision(config.precision, device))  # as the ClientApp
    return Federation(config, sites, spec, fedsm, device)


def train_round(federation: Federation, server_round: int) -> int:
    """One round of Algorithm 1 at every site, then FedSM aggregation; returns the training images seen."""
    updates: dict[str, FedSMUpdate] = {}
    images = 0
    for index, site in enumerate(federation.sites):
        settings = federation.config.round_settings(server_round, index)
        torch.manual_seed(settings.seed)
        memory = federation.memories.setdefault(site.name, DictMemory())
        update, metrics = fedsm_site_round(federation.fedsm.payload_for(site.name), index, site.train,
                                           federation.spec, settings, federation.device,
                                           federation.config.kept_state, memory)
        updates[site.name] = update
        images += min(len(site.train) * settings.local_epochs, int(metrics["steps"]) * settings.batch_size)
    federation.fedsm.aggregate(updates, server_round)
    config = federation.config
    schedule = AmplitudeSchedule(config.amplitude_freeze_round, config.amplitude_decay)
    if config.harmofl_settings.amplitude_normalization and schedule.due(server_round):  # as the FedSM strategy does
        federation.fedsm.fix_amplitude(schedule, list(updates.values()))
    return images


def fit_selector_head(federation: Federation) -> None:
    """Before an evaluation, the selector head from every site's embedding statistics (``selector-head``)."""
    config = federation.config
    if config.selector_head != "fitted":
        return
    selector = federation.spec.build_selector()
    set_weights(selector, federation.fedsm.selector_weights, "selector")
    statistics = {site.name: selector_statistics(selector, site.train, config.augmentation != "none",
                                                 config.batch_size * 2, federation.device)
                  for site in federation.sites}
    federation.fedsm.fit_selector_head(statistics, config.selector_shrinkage)


def fine_tune(federation: Federation, max_passes: int,
              validation: dict[str, SegArrays] | None = None) -> dict[str, FineTuned]:
    """``fine-tune-passes``: every site's personalized model becomes its fine-tuned global model, as in the app.

    ``validation`` (default: each site's validation split) chooses the pass;
    a site it leaves out keeps its personalized model.
    """
    splits = {site.name: site.val if validation is None else validation.get(site.name) for site in federation.sites}
    choosers = {name: [split] for name, split in splits.items() if split is not None}
    tuned = {name: found[0] for name, found in fine_tune_on_choosers(federation, max_passes, choosers).items()}
    for name, result in tuned.items():
        federation.fedsm.personalized[name] = result.weights
    return tuned


def fine_tune_as_run(federation: Federation) -> dict[str, list[FineTuned]]:
    """The app's final fine-tuning (``fine-tune-passes``; none when 0); the passes best on each validation half.

    Under ``fine-tune-gamma = "cross-fit"`` every site whose validation split
    halves into two non-empty halves also gets the passes best on half 0 and
    half 1 of the same training run, as the ClientApp keeps them.
    """
    config = federation.config
    if not config.fine_tune_passes:
        return {}
    cross_fit = config.fine_tune_gamma == "cross-fit"
    choosers = {site.name: [site.val, *(halve_by_case(site.val) if cross_fit and can_cross_fit(site.val) else ())]
                for site in federation.sites}
    tuned = fine_tune_on_choosers(federation, config.fine_tune_passes, choosers)
    for name, found in tuned.items():
        federation.fedsm.personalized[name] = found[0].weights
    return {name: found[1:] for name, found in tuned.items() if len(found) == 3}


def cross_fit_validation(federation: Federation, validation: dict[str, dict[str, float | list[float]]],
                         halves: dict[str, list[FineTuned]]) -> dict[str, dict[str, float | list[float]]]:
    """The validation metrics with each site in ``halves`` given cross-fitted gamma sweeps, as the ClientApp."""
    if not halves:
        return validation
    model, config = super_model(federation, federation.config.gamma), federation.config
    crossed = dict(validation)
    for index, site in enumerate(federation.sites):
        if site.name in halves:
            own = [federation.spec.load_segmentation(result.weights, site.name) for result in halves[site.name]]
            crossed[site.name] = with_cross_fitted_sweeps(validation[site.name], model, index, site.val, own,
                                                          config.batch_size * 2, federation.device, list(GAMMA_GRID),
                                                          config.route_by)
    return crossed


def fine_tune_on_choosers(federation: Federation, max_passes: int,
                          choosers: dict[str, list[SegArrays]]) -> dict[str, list[FineTuned]]:
    """Each site in ``choosers`` fine-tunes the global model once, its pass chosen on each of its splits in turn.

    The ClientApp's request carries round ``num-server-rounds + 1``
    (:mod:`server_app.strategies.fine_tuning`); the fine-tuning runs at the base ``lr``.
    No personalized model is replaced.
    """
    config, tuned = federation.config, {}
    for index, site in enumerate(federation.sites):
        if site.name not in choosers:
            continue
        settings = dataclasses.replace(config.round_settings(config.num_server_rounds + 1, index), lr=config.lr)
        tuned[site.name] = fine_tune_on_splits(federation.spec, federation.fedsm.global_weights, site.train,
                                               choosers[site.name], max_passes, settings, federation.device)
    return tuned


def super_model(federation: Federation, gamma: Gamma) -> SuperModel:
    """The server's current super model as modules."""
    fedsm = federation.fedsm
    return assemble_super_model(federation.spec, fedsm.global_weights,
                                [fedsm.personalized[site] for site in fedsm.site_names], fedsm.selector_weights,
                                gamma, names=fedsm.site_names)


def evaluate(federation: Federation, split: str, gamma: Gamma) -> dict[str, dict[str, float | list[float]]]:
    """Per-site metrics of the super model on ``split`` (validation also sweeps gamma), as the ClientApp."""
    model = super_model(federation, gamma)
    gammas = list(GAMMA_GRID) if split == "val" else []
    batch = federation.config.batch_size * 2
    return {site.name: evaluate_super_model(model, index, getattr(site, split), batch, federation.device, gammas,
                                            route_by=federation.config.route_by)
            for index, site in enumerate(federation.sites)}


def chosen_gamma(config: RunConfig, validation: dict[str, dict[str, float | list[float]]]) -> Gamma:
    """``gamma`` of the run config, or the choice on the last validation sweeps (``gamma-selection``)."""
    return select_gamma(config.gamma_selection, validation, config.gamma)


def run_in_process(config: RunConfig, progress=print) -> dict[str, object]:
    """Train and evaluate FedSM as the app does; return wall times, images per round and test Dice.

    Returns
    -------
    dict
        ``setup-seconds`` (data and models), ``round-seconds`` (one per
        round: training, aggregation and any validation), ``train-seconds``,
        ``train-images`` (per round), ``test-seconds``, ``total-seconds``,
        ``test-dice-super`` (pooled) and ``max-rss-gib`` of this process.
    """
    started = time.monotonic()
    federation = prepare(config)
    result: dict[str, object] = {"setup-seconds": _clock(federation.device) - started, "round-seconds": [],
                                 "train-seconds": [], "train-images": []}
    validation: dict[str, dict[str, float | list[float]]] = {}
    for server_round in range(1, config.num_server_rounds + 1):
        began = _clock(federation.device)
        result["train-images"].append(train_round(federation, server_round))
        result["train-seconds"].append(_clock(federation.device) - began)
        halves = fine_tune_as_run(federation) if server_round == config.num_server_rounds else {}
        if server_round % config.eval_every == 0 or server_round == config.num_server_rounds:
            fit_selector_head(federation)
            validation = cross_fit_validation(federation, evaluate(federation, "val", config.gamma), halves)
        result["round-seconds"].append(_clock(federation.device) - began)
        progress(f"[in-process] round {server_round}/{config.num_server_rounds}: "
                 f"{result['round-seconds'][-1]:.1f} s")
    began = _clock(federation.device)
    test = evaluate(federation, "test", chosen_gamma(config, validation))
    result["test-seconds"] = _clock(federation.device) - began
    result["total-seconds"] = _clock(federation.device) - started
    plain = {site: {k: v for k, v in m.items() if not isinstance(v, list)} for site, m in test.items()}
    result["test-dice-super"] = pool_site_metrics(plain)["dice-super"]
    result["max-rss-gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    return result
