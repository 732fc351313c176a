r"""Final fine-tuning: a site's personalized model as the global model adapted to it, stopped on its validation.

FedSM's SoftPull trains site ``k``'s personalized model alongside the global
one, one local pass per round. On a small site that is a few optimizer steps a
round, each from a fresh Adam, on the site's images alone: the model learns
its site's annotation protocol but little of the shared anatomy the global
model learns from all sites. Final fine-tuning ("local adaptation" of the
global model, Yu et al. 2020, arXiv 2002.04758) starts instead from the
federation's final global model ``w`` and takes up to ``E`` passes over the
site's training split with one Adam, keeping the pass whose validation Dice is
highest (pass 0, the global model itself, included):

.. math::

    v_k = w^{(e^*)}, \qquad e^* = \arg\max_{0 \le e \le E} \mathrm{Dice}(w^{(e)}; D_k^{val}),

where ``w^(e)`` is ``w`` after ``e`` passes of Adam on ``D_k^train`` (soft
Dice loss, the run's ``lr``, batch and augmentation). Ties keep the earlier
pass. The validation split only chooses ``e*``; the site's test split is not
read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from fedsm_core.algorithms.fedsm.client import segmentation_batch_fn
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.device import to_device
from fedsm_core.losses import soft_dice_loss
from fedsm_core.metrics import ImageScores
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import Weights, get_weights
from fedsm_core.training.batches import iterate_batches
from fedsm_core.training.local_update import Learner, train_local
from fedsm_core.training.optimizer_state import new_adam


@dataclasses.dataclass(frozen=True)
class FineTuned:
    """The outcome of :func:`fine_tune_on_validation` at one site.

    Attributes
    ----------
    weights : dict
        The personalized model ``v_k``: the global model after ``passes`` passes.
    passes : int
        ``e*``, the number of passes kept (0: the global model was best on validation).
    curve : tuple of float
        Validation Dice after pass 0, 1, ..., E (the passes taken).
    """

    weights: Weights
    passes: int
    curve: tuple[float, ...]

    @property
    def validation_dice(self) -> float:
        """The validation Dice of the kept model."""
        return self.curve[self.passes]


def fine_tune_on_validation(
    spec: ModelSpec,
    global_weights: Weights,
    train: SegArrays,
    val: SegArrays,
    max_passes: int,
    settings: RoundSettings,
    device: torch.device | str = "cpu",
) -> FineTuned:
    """Fine-tune ``global_weights`` on ``train`` for up to ``max_passes`` passes; keep the best pass on ``val``.

    Parameters
    ----------
    spec : ModelSpec
        The federation's model.
    global_weights : dict
        The final global model ``w``.
    train, val : SegArrays
        The site's training and validation splits (``val`` must hold images).
    max_passes : int
        ``E`` >= 1.
    settings : RoundSettings
        Batch size, ``lr``, augmentation, precision and the seed of the batch order.

    Returns
    -------
    FineTuned
    """
    return fine_tune_on_splits(spec, global_weights, train, [val], max_passes, settings, device)[0]


def fine_tune_on_splits(
    spec: ModelSpec,
    global_weights: Weights,
    train: SegArrays,
    choosers: Sequence[SegArrays],
    max_passes: int,
    settings: RoundSettings,
    device: torch.device | str = "cpu",
) -> list[FineTuned]:
    """One fine-tuning run, its pass chosen on each of ``choosers`` in turn: one :class:`FineTuned` per split.

    The passes are the same training run (seeded batch order) whichever split
    chooses, so choosing on a split here keeps the model
    :func:`fine_tune_on_validation` keeps on that split, bit for bit; only the
    validation work grows with the splits. Parameters as there; every split
    must hold images.
    """
    if max_passes < 1:
        raise ValueError(f"fine-tuning needs at least one pass; got max_passes = {max_passes}")
    if not choosers or any(len(split) == 0 for split in choosers):
        raise ValueError("fine-tuning chooses its pass on the site's validation split, which is empty")
    torch.manual_seed(settings.seed)
    model = spec.load_segmentation(global_weights, "global model").to(device)
    learner = Learner("personal", model, new_adam(model.parameters(), settings.lr), soft_dice_loss,
                      segmentation_batch_fn(settings))
    generator = torch.Generator().manual_seed(settings.seed)
    curves = [[_validation_dice(model, split, settings, device)] for split in choosers]
    best, kept = [0] * len(choosers), [get_weights(model)] * len(choosers)
    for done in range(1, max_passes + 1):
        train_local([learner], lambda: iterate_batches(train, settings.batch_size, shuffle=True,
                                                       augment=settings.augmentation, generator=generator),
                    1, settings.max_local_steps, device, settings.precision)
        for index, split in enumerate(choosers):
            curves[index].append(_validation_dice(model, split, settings, device))
            if curves[index][-1] > curves[index][best[index]]:  # strictly better: a tie keeps the earlier model
                best[index], kept[index] = done, get_weights(model)
    return [FineTuned(weights, passes, tuple(curve)) for weights, passes, curve in zip(kept, best, curves, strict=True)]


@torch.no_grad()
def _validation_dice(model: torch.nn.Module, val: SegArrays, settings: RoundSettings,
                     device: torch.device | str) -> float:
    """Mean per-image Dice over ``val``'s images with foreground, as every evaluation of the run scores a model."""
    model.eval()
    scores = ImageScores()
    for images, masks in iterate_batches(val, settings.batch_size * 2, shuffle=False):
        scores.add(model(to_device(images, device)), to_device(masks, device))
    return float(scores.result()["dice-global"])
