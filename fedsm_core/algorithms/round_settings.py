"""What one site trains with in one round: the local-training settings the server sends every round.

Built by :meth:`fedsm_core.config.RunConfig.round_settings` from the run's
training, FedSM, personalization and HarmoFL settings: the learning rate of the
round's place on the schedule and a seed of the (round, site) pair. FedSM's
site round and the baselines' (:mod:`fedsm_core.algorithms.baselines.global_client`)
both train with it.
"""

from __future__ import annotations

import dataclasses

from fedsm_core.algorithms.personalization.settings import PersonalizationSettings


@dataclasses.dataclass(frozen=True)
class RoundSettings:
    """Local-training settings of one site in one round.

    Attributes
    ----------
    batch_size : int
        Images per minibatch.
    local_epochs, max_local_steps : int
        Passes over the site's images, and the cap on minibatches (0: none).
    lr, selector_lr : float
        Adam's learning rate of the U-Nets in this round, and the selector's.
    seed : int
        Seeds shuffling and augmentation of this (round, site).
    selector_negatives, train_selector : bool
        Train the selector on restyled negatives too; train it at all (FedSM-extra's model rounds do not).
    augmentation : str
        ``none``, ``flip`` or ``affine``.
    personalization : PersonalizationSettings
        How the site trains its personalized model.
    perturbation_alpha : float
        HarmoFL's weight-perturbation radius (0: plain steps).
    precision : str
        ``auto``, ``fp32``, ``bf16`` or ``fp16``.
    style_augmentation : float
        Probability of a random acquisition style per training image.
    min_local_steps : int
        A round shorter than this many minibatches is stretched to it (0: never).
    """

    batch_size: int
    local_epochs: int
    max_local_steps: int
    lr: float
    selector_lr: float
    seed: int
    selector_negatives: bool = True
    train_selector: bool = True
    augmentation: str = "flip"
    personalization: PersonalizationSettings = dataclasses.field(default_factory=PersonalizationSettings)
    perturbation_alpha: float = 0.0
    precision: str = "fp32"
    style_augmentation: float = 0.0
    min_local_steps: int = 0
