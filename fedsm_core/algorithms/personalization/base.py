"""What every personalized-model trainer of FedSM shares: its inputs, its settings and its output.

In FedSM (Xu et al., CVPR 2022, Algorithm 1) every site steps three models on
each minibatch: the local copy ``w`` of the global model, its personalized
model and the selector. The methods of this package change only the second
one: they supply the :class:`~fedsm_core.training.local_update.Learner` that
the shared loop steps after the global copy, and say what the site sends back
as its personalized model (:meth:`PersonalTrainer.deployed`) and what it keeps
for its next round (:meth:`PersonalTrainer.client_state`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from fedsm_core.models.weights import Weights, get_weights, set_weights
from fedsm_core.training.local_update import Learner, LossFn

if TYPE_CHECKING:  # the settings name the methods of the registry, which imports this module
    from fedsm_core.algorithms.personalization.settings import PersonalizationSettings

Batches = Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]]
OptimizerFactory = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]


@dataclasses.dataclass
class PersonalStart:
    """What a personalization method starts a round from, at one site.

    Attributes
    ----------
    global_model : nn.Module
        The site's local copy of the global model ``w`` *before* local training;
        the global learner steps it in place during the round.
    global_weights, personal_weights : dict
        The global model and this site's personalized model as received.
    client_state : dict
        What this site kept from its previous round (:meth:`PersonalTrainer.client_state`);
        empty before its first round or after its node restarted.
    build : callable
        A segmentation model on the training device, whose weights :meth:`model_from` overwrites.
    optimizer : callable
        The run's optimizer over the given parameters (Adam at ``lr`` in FedSM).
    loss_fn : callable
        ``loss_fn(logits, masks)``, the soft Dice loss in FedSM.
    settings : PersonalizationSettings
    """

    global_model: nn.Module
    global_weights: Weights
    personal_weights: Weights
    client_state: Weights
    build: Callable[[], nn.Module]
    optimizer: OptimizerFactory
    loss_fn: LossFn
    settings: PersonalizationSettings

    def model_from(self, weights: Weights, where: str) -> nn.Module:
        """A fresh model holding ``weights``."""
        model = self.build()
        set_weights(model, weights, where)
        return model


class PersonalTrainer:
    """A personalized-model learner for one round, and what it hands on afterwards.

    The base class trains its model as the shared loop steps it and deploys the
    model as it ends the round, which is all FedSM's SoftPull, FT and Ditto need.
    """

    def __init__(self, learner: Learner) -> None:
        self.learner = learner

    def deployed(self, batches: Batches) -> Weights:
        """The personalized model sent to the server after the local epochs.

        ``batches`` yields the site's training split without augmentation, for
        methods that adapt their model once more at the end of the round.
        """
        return get_weights(self.learner.model)

    def client_state(self) -> Weights:
        """What the site keeps for its next round; nothing unless a method needs it."""
        return {}


def plain_learner(model: nn.Module, start: PersonalStart) -> Learner:
    """A learner that minimises the local loss of ``model`` with the run's optimizer."""
    return Learner("personal", model, start.optimizer(model.parameters()), start.loss_fn)


def start_softpull(start: PersonalStart) -> PersonalTrainer:
    """FedSM's own personalized model: local training from the model the server pulled.

    The server then mixes the replies with SoftPull (Eq. 4 of Xu et al.).
    """
    return PersonalTrainer(plain_learner(start.model_from(start.personal_weights, "personalized model"), start))


def start_fine_tuning(start: PersonalStart) -> PersonalTrainer:
    """FT: the personalized model is the received global model ``w`` fine-tuned on local data.

    ``v_k <- w``, then one step of the run's optimizer on ``f_k(v_k)`` per minibatch.
    Each round starts again from the received global model, so the site's
    previous personalized model is discarded; the server keeps the reply as it is.
    """
    return PersonalTrainer(plain_learner(start.model_from(start.global_weights, "global model"), start))
