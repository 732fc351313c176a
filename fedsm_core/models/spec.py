"""What defines the networks of a run, so every party builds identical models."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn as nn

from fedsm_core.checks import check_choice
from fedsm_core.models.amplitude import AmplitudeNormalization, AmplitudeNormalized
from fedsm_core.models.input_standardization import INPUT_NORMS, InputStandardized
from fedsm_core.models.module_copy import copy_module
from fedsm_core.models.segmentation import build_segmentation_model
from fedsm_core.models.selector import Selector
from fedsm_core.models.weights import set_weights


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Architecture of the global/personalized U-Nets and of the selector.

    Attributes
    ----------
    encoder : str
        smp encoder of the U-Net.
    num_structures : int
        Output channels of the U-Net (2 for fundus disc and cup).
    num_sites : int
        K, the selector's number of classes.
    selector_width : int
        Base width of the VGG-11-style selector.
    in_channels : int
        Image channels.
    norm : str
        Normalization layers of the U-Net: ``"group"`` or ``"batch"``.
    amplitude_size : int
        Image size of HarmoFL's amplitude normalization in front of every
        U-Net; 0 builds plain U-Nets.
    amplitude_decay, amplitude_window : float, int
        ``v`` and the low-frequency window of
        :class:`~fedsm_core.models.amplitude.AmplitudeNormalization`.
    input_norm : str
        ``"per-image"`` standardizes each image's channels before the U-Net
        (:mod:`fedsm_core.models.input_standardization`); ``"none"`` feeds it as it is.
    """

    encoder: str
    num_structures: int
    num_sites: int
    selector_width: int = 32
    in_channels: int = 3
    norm: str = "group"
    amplitude_size: int = 0
    amplitude_decay: float = 0.1
    amplitude_window: int = 0
    input_norm: str = "none"

    def __post_init__(self) -> None:
        check_choice("input-norm", self.input_norm, INPUT_NORMS)

    def build_segmentation(self) -> nn.Module:
        """A freshly initialised U-Net (behind per-image standardization, then amplitude normalization, if set)."""
        net = build_segmentation_model(self.encoder, self.num_structures, self.in_channels, norm=self.norm)
        if self.input_norm == "per-image":
            net = InputStandardized(net)
        if self.amplitude_size:
            layer = AmplitudeNormalization(self.in_channels, self.amplitude_decay, self.amplitude_window,
                                           self.amplitude_size)
            net = AmplitudeNormalized(layer, net)
        # Channels-last convolution weights make the convolutions run channels-last (the output follows the
        # weight's layout): the same values, about a fifth less time per U-Net step on the CPU.
        return net.to(memory_format=torch.channels_last)

    def load_segmentation(self, weights: Mapping[str, np.ndarray], where: str = "weights") -> nn.Module:
        """A U-Net holding ``weights`` (every entry; a key or shape mismatch raises ``ValueError`` naming ``where``).

        A copy of one template per spec, not a fresh build: the random
        initialisation that loading overwrites anyway costs more than the copy,
        and it draws nothing from the global random state.
        """
        model = self.blank_segmentation()
        set_weights(model, weights, where)
        return model

    def blank_segmentation(self) -> nn.Module:
        """A U-Net of this spec whose weights are placeholders for the caller to overwrite.

        The spec's template copied without its values (:func:`copy_module`): no random draws and no
        memory written, a small part of a fresh build's time.
        """
        return copy_module(_template(self), values=False)

    def build_selector(self) -> Selector:
        """A freshly initialised selector with K outputs."""
        return Selector(self.num_sites, self.selector_width, self.in_channels)

    def load_selector(self, weights: Mapping[str, np.ndarray], where: str = "selector") -> Selector:
        """A selector holding ``weights``: a copy of one template per spec, as :meth:`load_segmentation` does."""
        model = copy_module(_template(self, "selector"), values=False)
        set_weights(model, weights, where)
        return model

    def to_dict(self) -> dict[str, str | int]:
        """Plain values, for bundles and messages."""
        return dataclasses.asdict(self)


@functools.lru_cache(maxsize=16)
def _template(spec: ModelSpec, kind: str = "segmentation") -> nn.Module:
    """One model of ``spec`` to copy (``kind``: segmentation or selector), drawn apart from the caller's RNG."""
    with torch.random.fork_rng(devices=[]):
        return spec.build_selector() if kind == "selector" else spec.build_segmentation()
