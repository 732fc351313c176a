"""Run configuration: the ``[tool.flwr.app.config]`` keys, parsed once and checked.

Keys are kebab-case in ``pyproject.toml`` and on the command line
(``flwr run . --run-config "softpull-lambda=0.5"``); each maps to the snake_case
field of :class:`RunConfig` with the same name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedsm_core.data.augment import AUGMENTATIONS
from fedsm_core.data.synthetic_copies import STYLE_ONLY_DATASET, fundus_site_count
from fedsm_core.methods import STRATEGIES, method

# Also synthetic-fundus-<K> (K generated sites, fedsm_core.data.synthetic_copies) or a federation spec (*.toml)
DATASETS = ("synthetic-fundus", STYLE_ONLY_DATASET, "synthetic-prostate")
DEVICES = ("auto", "cpu", "cuda")
SELECTOR_WEIGHTINGS = ("equal", "size")
SELECTOR_MOMENTS = ("averaged", "local")  # the selector's Adam moments: averaged by the server, or kept at each site
OPTIMIZER_STATES = ("reset", "local", "averaged")  # a site's Adam for each model it trains: fresh, kept, averaged
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # see fedsm_core.training.precision
SELECTOR_HEADS = ("fitted", "trained")  # see fedsm_core.algorithms.fedsm.selector_head
NORMS = ("auto", "group", "batch")  # "auto": batch for fedbn (its point), group otherwise
GAMMA_SELECTIONS = ("per-model", "validation", "fixed")
# see fedsm_core.algorithms.personalization
PERSONALIZATIONS = ("softpull", "ft", "apfl", "ditto", "perfedavg", "pfedme")

WHERE = "set it in [tool.flwr.app.config] of pyproject.toml or with flwr run --run-config"


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every setting of a run, with its default.

    Attributes mirror the kebab-case keys of ``[tool.flwr.app.config]``;
    ``docs/configuration.md`` (generated from this class) documents each one.
    """

    num_server_rounds: int = 30
    strategy: str = "fedsm"
    dataset: str = "synthetic-fundus"
    held_out_site: str = ""
    image_size: int = 64
    data_scale: float = 0.5
    data_seed: int = 0
    seed: int = 0
    encoder: str = "mobilenet_v2"
    segmentation_norm: str = "auto"
    batch_size: int = 8
    local_epochs: int = 1
    max_local_steps: int = 0
    local_steps: int = 0
    augmentation: str = "flip"
    style_augmentation: float = 0.0
    lr: float = 2e-3
    lr_schedule: str = "constant"
    lr_warmup_rounds: int = 0
    lr_min_factor: float = 0.0
    selector_lr: float = 1e-3
    selector_width: int = 32
    selector_negatives: bool = True
    selector_weighting: str = "equal"
    selector_moments: str = "local"
    selector_head: str = "fitted"
    selector_shrinkage: float = 0.1
    personalization: str = "softpull"
    apfl_alpha: float = 0.5
    apfl_alpha_lr: float = 0.01
    ditto_lambda: float = 0.1
    perfedavg_alpha: float = 0.01
    perfedavg_steps: int = 1
    pfedme_lambda: float = 15.0
    pfedme_k: int = 5
    pfedme_eta: float = 0.005
    softpull_lambda: float = 0.99
    proximal_mu: float = 0.01
    server_optimizer: str = "none"
    server_lr: float = 1.0
    server_momentum: float = 0.0
    server_beta1: float = 0.9
    server_beta2: float = 0.99
    server_tau: float = 1e-3
    step_normalization: str = "none"
    site_weighting: str = "size"
    optimizer_state: str = "reset"
    extra_rounds: int = 10
    amplitude_normalization: bool = False
    amplitude_decay: float = 0.1
    amplitude_window: int = 0
    amplitude_freeze_round: int = 1
    weight_perturbation: bool = False
    perturbation_alpha: float = 0.05
    knn_per: bool = False
    knn_k: int = 10
    knn_kernel_scale: float = 1.0
    knn_capacity: int = 50_000
    knn_pixels_per_image: int = 256
    gamma: float = 0.5
    gamma_selection: str = "validation"
    eval_every: int = 5
    stop_window: int = 0
    stop_min_gain: float = 0.002
    stop_min_rounds: int = 1
    stop_check_every: int = 1
    output_dir: str = "runs"
    device: str = "auto"
    precision: str = "auto"
    deterministic: bool = False
    torch_threads: int = 1
    round_timeout: float = 3600.0
    min_replies: int = 1
    resume_from: str = ""

    def __post_init__(self) -> None:
        _check_choice("strategy", self.strategy, STRATEGIES)
        if not self.dataset.endswith(".toml") and fundus_site_count(self.dataset) is None:
            _check_choice("dataset", self.dataset, DATASETS)
        _check_choice("device", self.device, DEVICES)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("augmentation", self.augmentation, AUGMENTATIONS)
        _check_choice("segmentation-norm", self.segmentation_norm, NORMS)
        if method(self.strategy).family == "site-models" and self.segmentation_norm == "group":
            raise ValueError(
                "segmentation-norm = 'group' with strategy = 'fedbn': FedBN keeps batch-norm statistics (running mean "
                "and variance) at each site, and group norm has none, so only its affine parameters would stay "
                f"local; that is not FedBN. Use segmentation-norm 'auto' or 'batch'; {WHERE}")
        _check_choice("gamma-selection", self.gamma_selection, GAMMA_SELECTIONS)
        _check_choice("selector-weighting", self.selector_weighting, SELECTOR_WEIGHTINGS)
        _check_choice("selector-moments", self.selector_moments, SELECTOR_MOMENTS)
        _check_choice("selector-head", self.selector_head, SELECTOR_HEADS)
        _check_choice("optimizer-state", self.optimizer_state, OPTIMIZER_STATES)
        if self.optimizer_state == "averaged" and method(self.strategy).family != "global":
            raise ValueError(f"optimizer-state = 'averaged' averages the Adam state of the one model every site "
                             f"trains alike (FedAvg, FedProx, SCAFFOLD, HarmoFL); strategy = '{self.strategy}' trains "
                             f"models of the site's own as well. Use 'local' or 'reset'; {WHERE}")
        _check_range("num-server-rounds", self.num_server_rounds, 1, 100_000)
        _check_range("image-size", self.image_size, 32, 4096)
        if self.image_size % 32:
            raise ValueError(f"image-size = {self.image_size} must be a multiple of 32 (U-Net pooling); {WHERE}")
        _check_range("data-scale", self.data_scale, 1e-3, 100.0)
        _check_range("batch-size", self.batch_size, 1, 4096)
        _check_range("local-epochs", self.local_epochs, 1, 1000)
        _check_range("max-local-steps", self.max_local_steps, 0, 10**9)
        _check_range("local-steps", self.local_steps, 0, 10**9)
        _check_range("style-augmentation", self.style_augmentation, 0.0, 1.0)
        if self.local_steps and (self.local_epochs != 1 or self.max_local_steps):
            raise ValueError(f"local-steps = {self.local_steps} sets every site's number of minibatches per round by "
                             f"itself, but local-epochs = {self.local_epochs} and max-local-steps = "
                             f"{self.max_local_steps} are set too; keep local-epochs = 1 and max-local-steps = 0, "
                             f"or set local-steps = 0; {WHERE}")
        _check_range("lr", self.lr, 1e-8, 10.0)
        _check_range("selector-lr", self.selector_lr, 1e-8, 10.0)
        _check_range("selector-width", self.selector_width, 1, 512)
        _check_range("selector-shrinkage", self.selector_shrinkage, 0.0, 1.0)
        _check_range("softpull-lambda", self.softpull_lambda, 0.0, 1.0)
        _check_personalization(self)
        _check_range("proximal-mu", self.proximal_mu, 0.0, 1e6)
        _check_range("extra-rounds", self.extra_rounds, 1, 100_000)
        _check_range("amplitude-decay", self.amplitude_decay, 1e-6, 1.0)
        _check_range("amplitude-window", self.amplitude_window, 0, self.image_size // 2)
        _check_range("amplitude-freeze-round", self.amplitude_freeze_round, 0, 100_000)
        _check_range("perturbation-alpha", self.perturbation_alpha, 0.0, 100.0)
        _check_range("knn-k", self.knn_k, 1, 10_000)
        _check_range("knn-kernel-scale", self.knn_kernel_scale, 1e-9, 1e9)
        _check_range("knn-capacity", self.knn_capacity, 1, 10**9)
        _check_range("knn-pixels-per-image", self.knn_pixels_per_image, 1, 10**8)
        _check_range("gamma", self.gamma, 0.0, 1.0)
        _check_range("eval-every", self.eval_every, 1, 100_000)
        _check_stopping(self)
        _check_range("torch-threads", self.torch_threads, 0, 1024)
        _check_range("round-timeout", self.round_timeout, 1.0, 10**7)
        _check_range("min-replies", self.min_replies, 1, 100_000)
        if not self.output_dir:
            raise ValueError(f"output-dir is empty; {WHERE}")

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

    @property
    def uses_amplitude_normalization(self) -> bool:
        """HarmoFL always normalizes amplitudes; other strategies when ``amplitude-normalization`` is set."""
        return self.amplitude_normalization or method(self.strategy).adds("amplitude-normalization")

    @property
    def active_perturbation_alpha(self) -> float:
        """The weight-perturbation radius local training uses (0 = plain steps)."""
        always = method(self.strategy).adds("weight-perturbation")
        return self.perturbation_alpha if self.weight_perturbation or always else 0.0

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
        parsed = {fields[key].name: _coerce(key, value, fields[key].default) for key, value in values.items()}
        return cls(**parsed)

    def to_mapping(self) -> dict[str, Any]:
        """The kebab-case form, as written in ``[tool.flwr.app.config]``."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self)}


def _check_stopping(config: RunConfig) -> None:
    """The ``stop-*`` keys (``fedsm_core.training.stopping_rule``); ``stop-window = 0`` turns the rule off."""
    _check_range("stop-window", config.stop_window, 0, 100_000)
    _check_range("stop-min-gain", config.stop_min_gain, 0.0, 1.0)
    _check_range("stop-min-rounds", config.stop_min_rounds, 1, config.num_server_rounds)
    _check_range("stop-check-every", config.stop_check_every, 1, 100_000)
    if config.stop_window and method(config.strategy).extra_selector:
        raise ValueError(
            f"stop-window = {config.stop_window} with strategy = '{config.strategy}': its extra selector rounds "
            "start at num-server-rounds, so the run cannot stop early. Run 'fedsm' with the rule and give "
            f"'{config.strategy}' the rounds FedSM stopped at, or set stop-window = 0; {WHERE}")


def _check_personalization(config: RunConfig) -> None:
    """The personalization method and its hyper-parameters; ``softpull-lambda`` matters only for ``softpull``."""
    _check_choice("personalization", config.personalization, PERSONALIZATIONS)
    if config.personalization != "softpull" and method(config.strategy).family != "fedsm":
        raise ValueError(
            f"personalization = '{config.personalization}' trains FedSM's personalized models, but strategy = "
            f"'{config.strategy}' has none; use strategy 'fedsm' or 'fedsm-extra', or personalization 'softpull'; "
            f"{WHERE}"
        )
    _check_range("apfl-alpha", config.apfl_alpha, 0.0, 1.0)
    _check_range("apfl-alpha-lr", config.apfl_alpha_lr, 0.0, 10.0)
    _check_range("ditto-lambda", config.ditto_lambda, 0.0, 1e6)
    _check_range("perfedavg-alpha", config.perfedavg_alpha, 1e-8, 10.0)
    _check_range("perfedavg-steps", config.perfedavg_steps, 1, 100)
    _check_range("pfedme-lambda", config.pfedme_lambda, 0.0, 1e6)
    _check_range("pfedme-k", config.pfedme_k, 1, 100)
    _check_range("pfedme-eta", config.pfedme_eta, 0.0, 10.0)
    if config.pfedme_eta * config.pfedme_lambda > 1.0:
        raise ValueError(
            f"pfedme-eta * pfedme-lambda = {config.pfedme_eta} * {config.pfedme_lambda} is above 1: the local model "
            f"w_k <- w_k - eta * lambda * (w_k - theta) would overshoot theta; lower one of them; {WHERE}"
        )


def _coerce(key: str, value: Any, default: Any) -> Any:
    expected = type(default)
    if expected is bool and not isinstance(value, bool):
        raise TypeError(f"run-config '{key}' = {value!r} must be true or false; {WHERE}")
    if isinstance(value, bool) and expected is not bool:
        raise TypeError(f"run-config '{key}' = {value!r} is a boolean, expected {expected.__name__}; {WHERE}")
    if expected is float and isinstance(value, int):
        return float(value)
    if expected is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, expected):
        raise TypeError(
            f"run-config '{key}' = {value!r} has type {type(value).__name__}, expected {expected.__name__}; {WHERE}"
        )
    return value


def _check_range(key: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{key} = {value} is outside [{low}, {high}]; {WHERE}")


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key} = '{value}' is not one of {list(choices)}; {WHERE}")
