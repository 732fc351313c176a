"""kNN-Per's test evaluation at a site: slice Dice and, where the test ids name cases, per-case scores.

kNN-Per (:mod:`fedsm_core.algorithms.knn_per.knn_per`) personalizes a trained
model at test time, so its scores come from their own pass over the test
split rather than from :func:`~fedsm_core.evaluation.super_model_evaluation.evaluate_model`.
This module runs that pass on the global model (``dice-knn-per``) and, for
FedSM, on each image's routed model (``dice-super-knn``,
:mod:`fedsm_core.algorithms.fedsm.routed_knn_per`), and stacks the predicted
slices of each case into volumes (:class:`~fedsm_core.evaluation.case_scores.CaseMasks`),
so that a dataset of cases reports kNN-Per's per-case 3-D Dice and HD95 as
it does every other model's: ``case-dice-knn-per``, ``case-hd95-knn-per``,
``case-hd95-mm-knn-per``, ``num-missed-cases-knn-per`` (``-super-knn`` for the
routed variant), ``num-cases`` and ``num-empty-cases``.
"""

from __future__ import annotations

import torch

from fedsm_core.algorithms.fedsm.routed_knn_per import ROUTED_DICE, evaluate_routed_knn_per
from fedsm_core.algorithms.fedsm.super_model import SuperModel
from fedsm_core.algorithms.knn_per.knn_per import evaluate_knn_per
from fedsm_core.algorithms.knn_per.settings import KNNPerSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.case_scores import CaseMasks

KNN_DICE = "dice-knn-per"  # kNN-Per on the global model


def evaluate_knn_per_at_site(global_model: torch.nn.Module, train: SegArrays, val: SegArrays, test: SegArrays,
                             settings: KNNPerSettings, device: torch.device | str,
                             super_model: SuperModel | None = None) -> dict[str, float]:
    """kNN-Per on ``global_model`` (and on ``super_model``'s routes): datastore from ``train``, lam from ``val``.

    Parameters
    ----------
    global_model : torch.nn.Module
        The federation's global model after the last round.
    train, val, test : SegArrays
        The site's splits; the datastore holds pixels of ``train`` only.
    settings : KNNPerSettings
        ``k``, the datastore capacity, the lam grid and so on.
    device : torch.device or str
        Where the models and the neighbour search run.
    super_model : SuperModel, optional
        FedSM's super model: also kNN-Per on each image's routed model.

    Returns
    -------
    dict[str, float]
        The keys of :func:`~fedsm_core.algorithms.knn_per.knn_per.score_knn_per`
        (and of :func:`~fedsm_core.algorithms.fedsm.routed_knn_per.evaluate_routed_knn_per`),
        plus the per-case keys of the module docstring when the test ids name cases.
    """
    cases = CaseMasks(test.ids)
    scores = evaluate_knn_per(global_model, train, val, test, settings, device,
                              lambda masks: cases.add(KNN_DICE.removeprefix("dice-"), masks))
    if super_model is not None:
        scores |= evaluate_routed_knn_per(super_model, train, val, test, settings, device,
                                          lambda masks: cases.add(ROUTED_DICE.removeprefix("dice-"), masks))
    return scores | cases.result(test.masks, spacings=test.spacings)
