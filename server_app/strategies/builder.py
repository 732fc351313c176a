"""Build the strategy named by ``strategy`` in the run config, and what it saves at the end."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from fedsm_core.algorithms.baselines.fedbn import local_entries
from fedsm_core.algorithms.baselines.scaffold import zero_controls
from fedsm_core.algorithms.fedsm.fedsm import FedSM
from fedsm_core.algorithms.fedsm.fedsm_extra import extra_spec
from fedsm_core.algorithms.fedsm.selector_head import views_per_image
from fedsm_core.config import RunConfig
from fedsm_core.data.registry import DatasetInfo
from fedsm_core.methods import METHODS, MODEL_FILES, Method
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.run_files.bundle import SELECTOR_INCLUDES_GLOBAL, BundleInfo, save_bundle, save_global_model
from fedsm_core.training.optimizer_state import fresh_adam_state
from server_app.discovery import SiteNode
from server_app.round_plan import RoundPlan, round_plan
from server_app.strategies.fedavg import FedAvgStrategy, ScaffoldStrategy
from server_app.strategies.fedbn import FedBNStrategy
from server_app.strategies.fedsm import FedSMStrategy
from server_app.strategies.fedsm_extra import FedSMExtraStrategy
from server_app.strategies.site_strategy import EvaluationSink, SiteStrategy

SITE_MODELS_FOLDER = MODEL_FILES["site-models"]


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything a strategy builder needs."""

    config: RunConfig
    info: DatasetInfo
    spec: ModelSpec
    nodes: Sequence[SiteNode]
    on_evaluate: EvaluationSink
    state_key: str = ""

    @property
    def plan(self) -> RoundPlan:
        """The run's round plan (:func:`server_app.strategies.site_strategy.round_plan`)."""
        return round_plan(self.config, self.state_key)

    @property
    def method(self) -> Method:
        """The run's row of the table of methods."""
        return METHODS[self.config.strategy]

    def model_path(self, folder: Path) -> Path:
        """Where the run's deployed model goes in ``folder`` (the table's model file)."""
        return folder / self.method.model_file

    def extra(self, rounds: int, **more: object) -> dict[str, object]:
        """What every saved model records about its run (``rounds``: those it trained, the stopping rule included)."""
        return {"dataset": self.config.dataset, "rounds": rounds, "preprocessing": self.info.preprocessing, **more}


Saver = Callable[[Path], Path]


def _initial_model(setup: Setup) -> torch.nn.Module:
    torch.manual_seed(setup.config.seed)
    return setup.spec.build_segmentation()


def _build_fedsm(setup: Setup) -> tuple[SiteStrategy, Saver]:
    """FedSM: the selector trains with the models every round; gamma, chosen on validation, routes."""
    config, info = setup.config, setup.info
    fedsm, _ = config.start_fedsm(setup.spec, info.site_names, [node.pixels for node in setup.nodes])
    shrinkage = config.selector_shrinkage if config.selector_head == "fitted" else None
    strategy = FedSMStrategy(fedsm, setup.nodes, setup.plan, setup.on_evaluate, gamma=config.gamma,
                             gamma_selection=config.gamma_selection, selector_shrinkage=shrinkage,
                             statistics_views=views_per_image(config.augmentation != "none"),
                             fine_tune_passes=config.fine_tune_passes)
    return strategy, _super_model_saver(setup, fedsm, strategy)


def _build_fedsm_extra(setup: Setup) -> tuple[SiteStrategy, Saver]:
    """FedSM-extra: FedSM's models, then ``extra-rounds`` that train a K + 1-output selector."""
    config, info = setup.config, setup.info
    fedsm, extra_selector = config.start_fedsm(setup.spec, info.site_names, [node.pixels for node in setup.nodes],
                                          extra_spec(setup.spec))
    strategy = FedSMExtraStrategy(fedsm, extra_selector, config.num_server_rounds, setup.nodes, setup.plan,
                                  setup.on_evaluate)
    return strategy, _super_model_saver(setup, fedsm, strategy)


def _super_model_saver(setup: Setup, fedsm: FedSM, strategy: FedSMStrategy) -> Saver:
    """Saves the super model (FedSM-extra's: its K + 1 selector, no gamma) as a bundle, with the run's route-by."""
    config, info = setup.config, setup.info

    def save(folder: Path) -> Path:
        extra = setup.extra(strategy.num_rounds, **{"softpull-lambda": config.softpull_lambda,
                                                     "held-out-site": config.held_out_site,
                                                     "personalization": config.personalization})
        selector = fedsm.selector_weights
        gamma = strategy.gamma
        if isinstance(strategy, FedSMExtraStrategy):
            extra[SELECTOR_INCLUDES_GLOBAL], selector, gamma = True, strategy.extra_selector, 0.0
        bundle_info = BundleInfo(setup.spec, info.site_names, info.structures, gamma, config.image_size, extra,
                                 route_by=config.route_by)
        personalized = [fedsm.personalized[name] for name in info.site_names]
        return save_bundle(setup.model_path(folder), bundle_info, fedsm.global_weights, personalized, selector)

    return save


def _build_fedavg(setup: Setup) -> tuple[SiteStrategy, Saver]:
    """FedAvg and the variants that differ only at the sites (FedProx, HarmoFL: the row's local terms)."""
    model = _initial_model(setup)
    strategy = FedAvgStrategy(get_weights(model), setup.nodes, setup.plan, setup.on_evaluate,
                              name=setup.method.display, **_server_step(setup, model))
    return strategy, _global_model_saver(setup, strategy)


def _build_scaffold(setup: Setup) -> tuple[SiteStrategy, Saver]:
    """SCAFFOLD: FedAvg plus the server's control variate, starting at zero."""
    model = _initial_model(setup)
    strategy = ScaffoldStrategy(zero_controls(model), get_weights(model), setup.nodes, setup.plan,
                                setup.on_evaluate, **_server_step(setup, model))
    return strategy, _global_model_saver(setup, strategy)


def _server_step(setup: Setup, model: torch.nn.Module) -> dict[str, object]:
    """The server optimizer of a single-model strategy, and the Adam state it averages (if any)."""
    config = setup.config
    return {"server_optimizer": config.server_settings,
            "optimizer_state": fresh_adam_state(model) if config.optimizer_state == "averaged" else None}


def _global_model_saver(setup: Setup, strategy: FedAvgStrategy) -> Saver:
    config = setup.config

    def save(folder: Path) -> Path:
        return save_global_model(setup.model_path(folder), setup.spec, setup.info.structures, config.image_size,
                                 strategy.global_weights, setup.extra(strategy.num_rounds, strategy=config.strategy))

    return save


def _build_site_models(setup: Setup) -> tuple[SiteStrategy, Saver]:
    """FedBN: every site keeps its normalization layers."""
    config = setup.config
    model = _initial_model(setup)
    strategy = FedBNStrategy(get_weights(model), local_entries(model), setup.nodes, setup.plan, setup.on_evaluate)

    def save(folder: Path) -> Path:
        # No single model serves every site: each site's file holds its own normalization layers.
        for site in setup.info.site_names:
            save_global_model(setup.model_path(folder) / f"{site}.pt", setup.spec, setup.info.structures,
                              config.image_size, strategy.model_of(site),
                              setup.extra(strategy.num_rounds, strategy=config.strategy, site=site))
        return setup.model_path(folder)

    return strategy, save


# The strategy of each ``server`` name of the table of methods (fedsm_core.methods.SERVERS)
BUILDERS: dict[str, Callable[[Setup], tuple[SiteStrategy, Saver]]] = {
    "fedavg": _build_fedavg,
    "scaffold": _build_scaffold,
    "fedsm": _build_fedsm,
    "fedsm-extra": _build_fedsm_extra,
    "fedbn": _build_site_models,
}


def build_strategy(setup: Setup) -> tuple[SiteStrategy, Saver]:
    """The strategy the run's method names (its ``server`` in the table of methods), and its model's saver."""
    return BUILDERS[setup.method.server](setup)
