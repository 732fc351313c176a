"""Build the strategy named by ``strategy`` in the run config, and what it saves at the end."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from fedsm_core.algorithms.fedbn import local_entries
from fedsm_core.algorithms.fedsm import FedSM
from fedsm_core.algorithms.harmofl import AmplitudeSchedule
from fedsm_core.algorithms.scaffold import zero_controls
from fedsm_core.algorithms.fedsm_extra import extra_spec
from fedsm_core.bundle import SELECTOR_INCLUDES_GLOBAL, BundleInfo, save_bundle, save_global_model
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import DatasetInfo
from fedsm_core.data.statistics import pool_channel_statistics
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from server_app.discovery import SiteNode
from server_app.fedavg_strategy import FedAvgStrategy, ScaffoldStrategy
from server_app.fedbn_strategy import FedBNStrategy
from server_app.fedsm_extra_strategy import FedSMExtraStrategy
from server_app.fedsm_strategy import FedSMStrategy
from server_app.site_strategy import EvaluationSink, SiteStrategy

BUNDLE_FILE = "super_model.pt"
GLOBAL_MODEL_FILE = "global_model.pt"
SITE_MODELS_FOLDER = "site_models"
SINGLE_MODEL_NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "harmofl": "HarmoFL"}


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything a strategy builder needs."""

    config: RunConfig
    info: DatasetInfo
    spec: ModelSpec
    nodes: Sequence[SiteNode]
    on_evaluate: EvaluationSink


Saver = Callable[[Path], Path]


def _initial_model(setup: Setup) -> torch.nn.Module:
    torch.manual_seed(setup.config.seed)
    return setup.spec.build_segmentation()


def _build_fedsm(setup: Setup) -> tuple[SiteStrategy, Saver]:
    config, info = setup.config, setup.info
    model = _initial_model(setup)
    selector = setup.spec.build_selector()
    pixels = pool_channel_statistics([node.pixels for node in setup.nodes])
    selector.set_input_statistics(pixels.mean, pixels.std)
    fedsm = FedSM(info.site_names, get_weights(model), get_weights(selector), config.softpull_lambda,
                  config.selector_weighting, config.personalization)
    strategy = FedSMStrategy(fedsm, setup.nodes, config.gamma, config.eval_every, config.num_server_rounds,
                             setup.on_evaluate, gamma_selection=config.gamma_selection,
                             selector_shrinkage=config.selector_shrinkage if config.selector_head == "fitted" else None)

    def save(folder: Path) -> Path:
        extra = {"dataset": config.dataset, "rounds": config.num_server_rounds, "softpull-lambda": config.softpull_lambda,
                 "held-out-site": config.held_out_site, "preprocessing": info.preprocessing}
        extra["personalization"] = config.personalization
        bundle_info = BundleInfo(setup.spec, info.site_names, info.structures, strategy.gamma, config.image_size, extra)
        personalized = [fedsm.personalized[name] for name in info.site_names]
        return save_bundle(folder / BUNDLE_FILE, bundle_info, fedsm.global_weights, personalized, fedsm.selector_weights)

    return strategy, save


def _build_fedsm_extra(setup: Setup) -> tuple[SiteStrategy, Saver]:
    config, info = setup.config, setup.info
    model = _initial_model(setup)
    pixels = pool_channel_statistics([node.pixels for node in setup.nodes])
    selector = extra_spec(setup.spec).build_selector()
    selector.set_input_statistics(pixels.mean, pixels.std)
    frozen = setup.spec.build_selector()  # FedSM's own selector is not trained here
    fedsm = FedSM(info.site_names, get_weights(model), get_weights(frozen), config.softpull_lambda,
                  personalization=config.personalization)
    total = config.num_server_rounds + config.extra_rounds
    strategy = FedSMExtraStrategy(fedsm, get_weights(selector), config.num_server_rounds, setup.nodes,
                                  config.eval_every, total, setup.on_evaluate)

    def save(folder: Path) -> Path:
        extra = {"dataset": config.dataset, "rounds": total, "softpull-lambda": config.softpull_lambda,
                 "held-out-site": config.held_out_site, "preprocessing": info.preprocessing,
                 SELECTOR_INCLUDES_GLOBAL: True}
        bundle_info = BundleInfo(setup.spec, info.site_names, info.structures, 0.0, config.image_size, extra)
        personalized = [fedsm.personalized[name] for name in info.site_names]
        return save_bundle(folder / BUNDLE_FILE, bundle_info, fedsm.global_weights, personalized,
                           strategy.extra_selector)

    return strategy, save


def _build_single_model(setup: Setup) -> tuple[SiteStrategy, Saver]:
    config = setup.config
    model = _initial_model(setup)
    common = (get_weights(model), setup.nodes, config.eval_every, config.num_server_rounds, setup.on_evaluate)
    if config.strategy == "scaffold":
        strategy: FedAvgStrategy = ScaffoldStrategy(zero_controls(model), *common)
    else:
        strategy = FedAvgStrategy(*common, name=SINGLE_MODEL_NAMES[config.strategy])

    def save(folder: Path) -> Path:
        extra = {"dataset": config.dataset, "rounds": config.num_server_rounds, "strategy": config.strategy,
                 "preprocessing": setup.info.preprocessing}
        return save_global_model(folder / GLOBAL_MODEL_FILE, setup.spec, setup.info.structures, config.image_size,
                                 strategy.global_weights, extra)

    return strategy, save


def _build_fedbn(setup: Setup) -> tuple[SiteStrategy, Saver]:
    config = setup.config
    model = _initial_model(setup)
    strategy = FedBNStrategy(get_weights(model), local_entries(model), setup.nodes, config.eval_every,
                             config.num_server_rounds, setup.on_evaluate)

    def save(folder: Path) -> Path:
        # No single model serves every site: each site's file holds its own normalization layers.
        extra = {"dataset": config.dataset, "rounds": config.num_server_rounds, "strategy": config.strategy,
                 "preprocessing": setup.info.preprocessing}
        for site in setup.info.site_names:
            save_global_model(folder / SITE_MODELS_FOLDER / f"{site}.pt", setup.spec, setup.info.structures,
                              config.image_size, strategy.model_of(site), {**extra, "site": site})
        return folder / SITE_MODELS_FOLDER

    return strategy, save


BUILDERS: dict[str, Callable[[Setup], tuple[SiteStrategy, Saver]]] = {
    "fedsm": _build_fedsm,
    "fedavg": _build_single_model,
    "fedprox": _build_single_model,
    "scaffold": _build_single_model,
    "fedsm-extra": _build_fedsm_extra,
    "harmofl": _build_single_model,
    "fedbn": _build_fedbn,
}


def build_strategy(setup: Setup) -> tuple[SiteStrategy, Saver]:
    """The strategy for ``setup.config.strategy`` and a function that saves its final model."""
    if setup.config.strategy not in BUILDERS:
        raise ValueError(f"strategy = '{setup.config.strategy}' has no server builder; known: {sorted(BUILDERS)}")
    strategy, save = BUILDERS[setup.config.strategy](setup)
    if setup.config.uses_amplitude_normalization:
        strategy.amplitude = AmplitudeSchedule(setup.config.amplitude_freeze_round, setup.config.amplitude_decay)
    return strategy, save
