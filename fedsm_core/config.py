"""Run configuration: the ``[tool.flwr.app.config]`` keys, parsed once and checked before a run starts.

Keys are kebab-case in ``pyproject.toml`` and on the command line
(``flwr run . --run-config "softpull-lambda=0.5"``); each maps to the snake_case
field of :class:`RunConfig` with the same name. The keys stay flat (they are
the user's interface), but each subsystem owns its own: a field declared with
:func:`owned` takes its default, its allowed values and its check from that
subsystem's settings dataclass, and :class:`RunConfig` composes those settings
(``training_settings``, ``fedsm_settings``, ...) once, when it is built. What
is checked here is the run's own keys and the rules across subsystems.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from fedsm_core.algorithms.attacks import FEDSM_ONLY, AttackSettings
from fedsm_core.algorithms.baselines.harmofl_settings import HarmoFLSettings
from fedsm_core.algorithms.fedsm.fedsm import FedSM, initial_fedsm
from fedsm_core.algorithms.fedsm.settings import FedSMSettings
from fedsm_core.algorithms.fedsm.site_round import KeptState
from fedsm_core.algorithms.knn_per.settings import KNNPerSettings
from fedsm_core.algorithms.personalization.settings import PersonalizationSettings
from fedsm_core.algorithms.robust_aggregation import AggregationSettings
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.algorithms.server_optimizer import ServerOptimizerSettings
from fedsm_core.checks import check_choice, check_settings, coerce_value, setting
from fedsm_core.data.statistics import ChannelStatistics
from fedsm_core.data.synthetic_copies import STYLE_ONLY_DATASET, fundus_site_count
from fedsm_core.methods import STRATEGIES, method
from fedsm_core.models import segmentation
from fedsm_core.models.input_standardization import INPUT_NORMS
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import Weights
from fedsm_core.training.lr_schedule import LRSchedule
from fedsm_core.training.settings import TrainingSettings
from fedsm_core.training.stopping_rule import StoppingRule, StoppingSettings

# Also synthetic-fundus-<K> (K generated sites, fedsm_core.data.synthetic_copies) or a federation spec (*.toml)
DATASETS = ("synthetic-fundus", STYLE_ONLY_DATASET, "synthetic-prostate")
DEVICES = ("auto", "cpu", "cuda")
NORMS = ("auto", *segmentation.NORMS)  # "auto": batch for fedbn (its point), group otherwise

WHERE = "set it in [tool.flwr.app.config] of pyproject.toml or with flwr run --run-config"


def owned(owner: type, name: str) -> Any:
    """A run-config field that belongs to ``owner``'s field ``name``: its default, key and check are the owner's."""
    field = {f.name: f for f in dataclasses.fields(owner)}[name]
    return dataclasses.field(default=field.default, metadata={"owner": owner, "field": name})


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every setting of a run, with its default.

    Attributes mirror the kebab-case keys of ``[tool.flwr.app.config]``;
    ``docs/configuration.md`` (generated from this class) documents each one.
    """

    num_server_rounds: int = setting(30, "num-server-rounds", low=1, high=100_000)
    strategy: str = setting("fedsm", "strategy", choices=STRATEGIES)
    dataset: str = setting("synthetic-fundus", "dataset", allowed=", ".join(f"`{name}`" for name in DATASETS)
                           + ", `synthetic-fundus-<K>`, or a federation spec `*.toml`")
    held_out_site: str = ""
    image_size: int = setting(64, "image-size", low=32, high=4096, allowed="[32, 4096], a multiple of 32")
    data_scale: float = setting(0.5, "data-scale", low=1e-3, high=100.0)
    data_seed: int = 0
    seed: int = 0
    encoder: str = "mobilenet_v2"
    segmentation_norm: str = setting("auto", "segmentation-norm", choices=NORMS)
    input_norm: str = setting("per-image", "input-norm", choices=INPUT_NORMS)
    batch_size: int = owned(TrainingSettings, "batch_size")
    local_epochs: int = owned(TrainingSettings, "local_epochs")
    max_local_steps: int = owned(TrainingSettings, "max_local_steps")
    local_steps: int = owned(TrainingSettings, "local_steps")
    min_local_steps: int = owned(TrainingSettings, "min_local_steps")
    augmentation: str = owned(TrainingSettings, "augmentation")
    style_augmentation: float = owned(TrainingSettings, "style_augmentation")
    lr: float = owned(TrainingSettings, "lr")
    lr_schedule: str = owned(LRSchedule, "name")
    lr_warmup_rounds: int = owned(LRSchedule, "warmup_rounds")
    lr_min_factor: float = owned(LRSchedule, "min_factor")
    selector_lr: float = owned(FedSMSettings, "selector_lr")
    selector_width: int = owned(FedSMSettings, "selector_width")
    selector_negatives: bool = owned(FedSMSettings, "selector_negatives")
    selector_weighting: str = owned(FedSMSettings, "selector_weighting")
    selector_moments: str = owned(FedSMSettings, "selector_moments")
    selector_head: str = owned(FedSMSettings, "selector_head")
    selector_shrinkage: float = owned(FedSMSettings, "selector_shrinkage")
    personalization: str = owned(PersonalizationSettings, "method")
    apfl_alpha: float = owned(PersonalizationSettings, "apfl_alpha")
    apfl_alpha_lr: float = owned(PersonalizationSettings, "apfl_alpha_lr")
    ditto_lambda: float = owned(PersonalizationSettings, "ditto_lambda")
    perfedavg_alpha: float = owned(PersonalizationSettings, "perfedavg_alpha")
    perfedavg_steps: int = owned(PersonalizationSettings, "perfedavg_steps")
    pfedme_lambda: float = owned(PersonalizationSettings, "pfedme_lambda")
    pfedme_k: int = owned(PersonalizationSettings, "pfedme_k")
    pfedme_eta: float = owned(PersonalizationSettings, "pfedme_eta")
    softpull_lambda: float = owned(FedSMSettings, "softpull_lambda")
    proximal_mu: float = setting(0.01, "proximal-mu", low=0.0, high=1e6)
    server_optimizer: str = owned(ServerOptimizerSettings, "name")
    server_lr: float = owned(ServerOptimizerSettings, "lr")
    server_momentum: float = owned(ServerOptimizerSettings, "momentum")
    server_beta1: float = owned(ServerOptimizerSettings, "beta_1")
    server_beta2: float = owned(ServerOptimizerSettings, "beta_2")
    server_tau: float = owned(ServerOptimizerSettings, "tau")
    step_normalization: str = owned(ServerOptimizerSettings, "step_normalization")
    site_weighting: str = owned(ServerOptimizerSettings, "site_weighting")
    aggregation: str = owned(AggregationSettings, "name")
    trim_fraction: float = owned(AggregationSettings, "trim_fraction")
    krum_byzantine: int = owned(AggregationSettings, "krum_byzantine")
    filter_factor: float = owned(AggregationSettings, "filter_factor")
    filter_min_cosine: float = owned(AggregationSettings, "filter_min_cosine")
    filter_memory: bool = owned(AggregationSettings, "filter_memory")
    clip_update_norm: float = owned(AggregationSettings, "clip_update_norm")
    attack: str = owned(AttackSettings, "plan")
    attack_scale: float = owned(AttackSettings, "scale")
    optimizer_state: str = owned(TrainingSettings, "optimizer_state")
    extra_rounds: int = owned(FedSMSettings, "extra_rounds")
    amplitude_normalization: bool = owned(HarmoFLSettings, "amplitude_normalization")
    amplitude_decay: float = owned(HarmoFLSettings, "amplitude_decay")
    amplitude_window: int = owned(HarmoFLSettings, "amplitude_window")
    amplitude_freeze_round: int = owned(HarmoFLSettings, "amplitude_freeze_round")
    weight_perturbation: bool = owned(HarmoFLSettings, "weight_perturbation")
    perturbation_alpha: float = owned(HarmoFLSettings, "perturbation_alpha")
    knn_per: bool = False
    knn_k: int = owned(KNNPerSettings, "k")
    knn_kernel_scale: float = owned(KNNPerSettings, "kernel_scale")
    knn_capacity: int = owned(KNNPerSettings, "capacity")
    knn_pixels_per_image: int = owned(KNNPerSettings, "pixels_per_image")
    gamma: float = owned(FedSMSettings, "gamma")
    gamma_selection: str = owned(FedSMSettings, "gamma_selection")
    route_by: str = owned(FedSMSettings, "route_by")
    fine_tune_passes: int = owned(FedSMSettings, "fine_tune_passes")
    fine_tune_gamma: str = owned(FedSMSettings, "fine_tune_gamma")
    eval_every: int = setting(5, "eval-every", low=1, high=100_000)
    stop_window: int = owned(StoppingSettings, "window")
    stop_min_gain: float = owned(StoppingSettings, "min_gain")
    stop_min_rounds: int = owned(StoppingSettings, "min_rounds")
    stop_check_every: int = owned(StoppingSettings, "check_every")
    output_dir: str = setting("runs", "output-dir", allowed="not empty")
    device: str = setting("auto", "device", choices=DEVICES)
    precision: str = owned(TrainingSettings, "precision")
    deterministic: bool = False
    torch_threads: int = setting(1, "torch-threads", low=0, high=1024)
    round_timeout: float = setting(3600.0, "round-timeout", low=1.0, high=10**7)
    min_replies: int = setting(1, "min-replies", low=1, high=100_000)
    resume_from: str = ""

    def __post_init__(self) -> None:
        try:
            self._check()
        except ValueError as error:
            raise ValueError(f"{error}; {WHERE}") from None

    def _check(self) -> None:
        """The run's own keys, every subsystem's settings (each checks itself), then the rules across them."""
        check_settings(self)
        if not self.dataset.endswith(".toml") and fundus_site_count(self.dataset) is None:
            check_choice("dataset", self.dataset, DATASETS)
        if self.image_size % 32:
            raise ValueError(f"image-size = {self.image_size} must be a multiple of 32 (U-Net pooling)")
        if not self.output_dir:
            raise ValueError("output-dir is empty")
        # Each subsystem's settings are built here, once (each checks itself), and kept for the run.
        _ = (self.training_settings, self.fedsm_settings, self.personalization_settings, self.knn_settings,
             self.harmofl_settings, self.server_settings, self.aggregation_settings, self.attack_settings,
             self.stopping_rule)
        _check_across(self)

    def _owned(self, owner: type, **more: Any) -> Any:
        """``owner``'s settings from this run's fields that belong to it (:func:`owned`), plus ``more``."""
        values = {f.metadata["field"]: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.metadata.get("owner") is owner}
        return owner(**values, **more)

    @cached_property
    def training_settings(self) -> TrainingSettings:
        """Local training: batch, steps per round, augmentation, learning rate and its schedule, precision."""
        return self._owned(TrainingSettings, schedule=self._owned(LRSchedule))

    @cached_property
    def fedsm_settings(self) -> FedSMSettings:
        """SoftPull's lambda, the selector, gamma and FedSM-extra's selector rounds."""
        return self._owned(FedSMSettings)

    @cached_property
    def personalization_settings(self) -> PersonalizationSettings:
        """How FedSM trains the personalized models."""
        return self._owned(PersonalizationSettings)

    @cached_property
    def knn_settings(self) -> KNNPerSettings:
        """kNN-Per's datastore and search; seeded by the run's ``seed``."""
        return self._owned(KNNPerSettings, seed=self.seed)

    @cached_property
    def harmofl_settings(self) -> HarmoFLSettings:
        """HarmoFL's two halves as this run uses them: ``strategy = "harmofl"`` turns both on."""
        settings = self._owned(HarmoFLSettings)
        return dataclasses.replace(
            settings,
            amplitude_normalization=settings.amplitude_normalization or method(self.strategy).adds(
                "amplitude-normalization"),
            weight_perturbation=settings.weight_perturbation or method(self.strategy).adds("weight-perturbation"))

    @cached_property
    def server_settings(self) -> ServerOptimizerSettings:
        """How every shared model moves toward the sites' average."""
        return self._owned(ServerOptimizerSettings)

    @cached_property
    def aggregation_settings(self) -> AggregationSettings:
        """How every shared model averages the sites: the weighted mean or a robust statistic."""
        return self._owned(AggregationSettings)

    @cached_property
    def attack_settings(self) -> AttackSettings:
        """Which simulated sites turn malicious, and how (simulation only)."""
        return self._owned(AttackSettings)

    @cached_property
    def stopping_rule(self) -> StoppingRule | None:
        """The rule of the ``stop-*`` keys up to ``num-server-rounds``; ``None`` when ``stop-window = 0``."""
        return self._owned(StoppingSettings).rule(self.num_server_rounds)

    @property
    def kept_state(self) -> KeptState:
        """What a FedSM site keeps between rounds: ``selector-moments`` and ``optimizer-state``."""
        return KeptState(self.selector_moments == "local", self.optimizer_state == "local")

    @property
    def model_norm(self) -> str:
        """The U-Net's normalization that runs: ``segmentation-norm``, with ``auto`` resolved.

        ``auto`` is batch normalization for FedBN, whose whole point is keeping
        batch-norm statistics local (Li et al. 2021), and group normalization
        otherwise (averaged running statistics lag the weights after a few
        local steps).
        """
        if self.segmentation_norm != "auto":
            return self.segmentation_norm
        return "batch" if method(self.strategy).family == "site-models" else "group"

    @property
    def total_rounds(self) -> int:
        """Rounds the run lasts: ``num-server-rounds``, plus ``extra-rounds`` for FedSM-extra's selector."""
        extra = self.extra_rounds if method(self.strategy).extra_selector else 0
        return self.num_server_rounds + extra

    def model_spec(self, num_structures: int, num_sites: int) -> ModelSpec:
        """The models this run's settings define; server, clients and experiments all build them here."""
        harmofl = self.harmofl_settings
        return ModelSpec(
            self.encoder, num_structures, num_sites, self.selector_width, norm=self.model_norm,
            amplitude_size=self.image_size if harmofl.amplitude_normalization else 0,
            amplitude_decay=harmofl.amplitude_decay, amplitude_window=harmofl.amplitude_window,
            input_norm=self.input_norm,
        )

    def start_fedsm(self, spec: ModelSpec, site_names: Sequence[str], site_pixels: Sequence[ChannelStatistics],
                    extra_selector_spec: ModelSpec | None = None) -> tuple[FedSM, Weights | None]:
        """FedSM's start state for this run (:func:`~fedsm_core.algorithms.fedsm.fedsm.initial_fedsm`)."""
        return initial_fedsm(spec, site_names, site_pixels, seed=self.seed, settings=self.fedsm_settings,
                             personalization=self.personalization, server_optimizer=self.server_settings,
                             aggregation=self.aggregation_settings, extra_selector_spec=extra_selector_spec)

    def round_settings(self, server_round: int, site_index: int) -> RoundSettings:
        """What site ``site_index`` trains with in round ``server_round``; each (round, site) has its own seed.

        ``lr`` follows the run's schedule over ``num-server-rounds``
        (:mod:`fedsm_core.training.lr_schedule`). With ``local-steps = S`` every
        site takes exactly ``S`` minibatches
        (:meth:`~fedsm_core.training.settings.TrainingSettings.epochs_and_steps`).
        """
        training = self.training_settings
        epochs, steps = training.epochs_and_steps()
        return RoundSettings(
            batch_size=training.batch_size,
            local_epochs=epochs,
            max_local_steps=steps,
            lr=training.lr_in_round(server_round, self.num_server_rounds),
            selector_lr=self.selector_lr,
            seed=self.seed * 1_000_003 + server_round * 101 + site_index,
            selector_negatives=self.selector_negatives,
            augmentation=training.augmentation,
            personalization=self.personalization_settings,
            perturbation_alpha=self.harmofl_settings.active_perturbation_alpha,
            precision=training.precision,
            style_augmentation=training.style_augmentation,
            min_local_steps=training.min_local_steps,
        )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunConfig:
        """Parse kebab-case keys; missing keys take their defaults.

        Raises
        ------
        ValueError
            For an unknown key (the message lists the valid ones) or a value out
            of range.
        TypeError
            For a value of the wrong type.
        """
        fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"unknown run-config key(s) {unknown}; valid keys: {sorted(fields)}")
        parsed = {fields[key].name: coerce_value(key, value, fields[key].default, WHERE)
                  for key, value in values.items()}
        return cls(**parsed)

    def to_mapping(self) -> dict[str, Any]:
        """The kebab-case form, as written in ``[tool.flwr.app.config]``."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self)}


def _check_across(config: RunConfig) -> None:
    """The rules that join two subsystems' settings, or a setting and the strategy."""
    family = method(config.strategy).family
    if family == "site-models" and config.segmentation_norm in ("group", "instance"):
        raise ValueError(
            f"segmentation-norm = '{config.segmentation_norm}' with strategy = 'fedbn': FedBN keeps batch-norm "
            f"statistics (running mean and variance) at each site, and {config.segmentation_norm} norm has none, so "
            "only its affine parameters would stay local; that is not FedBN. Use segmentation-norm 'auto' or 'batch'")
    if config.optimizer_state == "averaged" and family != "global":
        raise ValueError(f"optimizer-state = 'averaged' averages the Adam state of the one model every site "
                         f"trains alike (FedAvg, FedProx, SCAFFOLD, HarmoFL); strategy = '{config.strategy}' trains "
                         f"models of the site's own as well. Use 'local' or 'reset'")
    if config.personalization != "softpull" and family != "fedsm":
        raise ValueError(
            f"personalization = '{config.personalization}' trains FedSM's personalized models, but strategy = "
            f"'{config.strategy}' has none; use strategy 'fedsm' or 'fedsm-extra', or personalization 'softpull'")
    if config.amplitude_window > config.image_size // 2:
        raise ValueError(f"amplitude-window = {config.amplitude_window} is outside [0, {config.image_size // 2}] "
                         f"(half of image-size = {config.image_size})")
    if config.aggregation != "mean" and config.step_normalization != "none":
        raise ValueError(f"aggregation = '{config.aggregation}' with step-normalization = "
                         f"'{config.step_normalization}': FedNova's average weighs each site's update by its steps, "
                         "which a robust statistic does not; set aggregation = 'mean' for FedNova, or "
                         "step-normalization = 'none'")
    fedsm_attacks = sorted({kind for _, kind in config.attack_settings.items() if kind in FEDSM_ONLY})
    if fedsm_attacks and family != "fedsm":
        raise ValueError(f"attack = '{config.attack}': {fedsm_attacks} attack FedSM's personalized models or "
                         f"selector, which strategy = '{config.strategy}' has none of; use 'sign-flip', 'noise', "
                         "'label-flip' or 'inflate-count'")
    if config.stop_window and method(config.strategy).extra_selector:
        raise ValueError(
            f"stop-window = {config.stop_window} with strategy = '{config.strategy}': its extra selector rounds "
            "start at num-server-rounds, so the run cannot stop early. Run 'fedsm' with the rule and give "
            f"'{config.strategy}' the rounds FedSM stopped at, or set stop-window = 0")
