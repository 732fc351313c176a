"""Ditto (Li et al., ICML 2021) as FedSM's personalized-model trainer."""

from __future__ import annotations

from fedsm_core.algorithms.baselines.fedprox import ProximalTerm
from fedsm_core.algorithms.personalization.base import PersonalStart, PersonalTrainer
from fedsm_core.training.local_update import Learner


def start_ditto(start: PersonalStart) -> PersonalTrainer:
    """Ditto's personal objective, ``min_v f_k(v) + lambda / 2 * ||v - w||^2`` (Eq. 2 of Li et al.).

    ``v_k`` continues from the site's personalized model as the server kept it,
    and ``w`` is the global model received this round (Algorithm 1 of Ditto
    anchors on ``w^t``, not on the local copy that moves during the round). Per
    minibatch, one step of the run's optimizer on the gradient

        grad f_k(v_k) + lambda * (v_k - w).

    The proximal term is FedProx's :class:`~fedsm_core.algorithms.baselines.fedprox.ProximalTerm`
    with ``mu = lambda``; ``lambda = 0`` is local training of ``v_k``. The
    server keeps every reply as it is: Ditto's personalized models never mix.
    """
    anchor = ProximalTerm(start.global_model, start.settings.ditto_lambda)
    model = start.model_from(start.personal_weights, "personalized model")
    learner = Learner("personal", model, start.optimizer(model.parameters()), start.loss_fn, hooks=[anchor])
    return PersonalTrainer(learner)
