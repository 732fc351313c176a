"""The one local-training loop of every strategy, with hooks for what differs.

FedSM steps three models on each minibatch (global copy, personalized model,
selector); FedProx adds a proximal term, Scaffold corrects gradients. All of them
are :class:`Learner` objects driven by :func:`train_local`, each with its own
:class:`TrainingHook` list, so no algorithm carries a copy of the loop. The
loop also owns the numeric precision (:mod:`fedsm_core.training.precision`):
every learner's forward pass runs under the run's autocast, and float16 steps
go through a gradient scaler, whatever the algorithm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn as nn

from fedsm_core.data.arrays import SegArrays
from fedsm_core.device import to_device
from fedsm_core.training.batches import batches_per_pass, iterate_batches
from fedsm_core.training.precision import FP32, StepPrecision, step_precision

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BatchFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class TrainingHook:
    """Base hook: a no-op at every point of a training step.

    Subclasses override what their algorithm changes: ``extra_loss`` adds a
    term to the loss (FedProx's ``mu/2 * ||w - w_global||^2``), ``regrade``
    may recompute the gradients elsewhere (HarmoFL's weight perturbation),
    ``after_backward`` edits gradients before the optimizer step (Scaffold's
    ``- c_k + c``).
    """

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        """A term added to the loss before ``backward``; ``None`` adds nothing."""
        return None

    def regrade(self, model: nn.Module, closure: Callable[[], torch.Tensor]) -> None:
        """Called after the first ``backward``; ``closure()`` recomputes loss and gradients."""

    def after_backward(self, model: nn.Module) -> None:
        """Called after ``backward`` and before ``optimizer.step``."""

    def after_step(self, model: nn.Module) -> None:
        """Called after ``optimizer.step``."""


def segmentation_batch(images: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of a segmentation learner: the images and their masks."""
    return images, masks


@dataclasses.dataclass
class Learner:
    """A model with its optimizer, loss and hooks, stepped once per minibatch.

    Attributes
    ----------
    name : str
        Key of this learner's mean loss in the metrics of :func:`train_local`.
    model, optimizer : torch.nn.Module, torch.optim.Optimizer
    loss_fn : callable
        ``loss_fn(outputs, targets) -> scalar``.
    batch_fn : callable
        ``batch_fn(images, masks) -> (inputs, targets)``; a selector learner
        returns site labels as targets (and may add inputs).
    hooks : sequence of TrainingHook
    """

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: LossFn
    batch_fn: BatchFn = segmentation_batch
    hooks: Sequence[TrainingHook] = ()

    def step(self, images: torch.Tensor, masks: torch.Tensor, precision: StepPrecision = FP32) -> torch.Tensor:
        """One optimizer step on one minibatch; returns the data loss (a detached scalar tensor).

        The loss stays a tensor so that a CUDA step does not wait for the GPU;
        :func:`train_local` reads the sums once, at the end.
        """
        self.model.train()
        inputs, targets = self.batch_fn(images, masks)

        def closure() -> torch.Tensor:
            self.optimizer.zero_grad(set_to_none=True)
            with precision.autocast():
                loss = self.loss_fn(self.model(inputs), targets)
                total = loss
                for hook in self.hooks:
                    extra = hook.extra_loss(self.model)
                    if extra is not None:
                        total = total + extra
            precision.backward(total)
            return loss

        loss = closure()
        for hook in self.hooks:
            hook.regrade(self.model, closure)
        precision.unscale(self.model, self.optimizer)
        for hook in self.hooks:
            hook.after_backward(self.model)
        precision.step(self.optimizer)
        for hook in self.hooks:
            hook.after_step(self.model)
        return loss.detach()


def train_local(
    learners: Sequence[Learner],
    batches: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]],
    epochs: int,
    max_steps: int = 0,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
) -> dict[str, float]:
    """Run local epochs; every learner takes one step on every minibatch.

    Parameters
    ----------
    learners : sequence of Learner
        Stepped in order on each minibatch (Algorithm 1 of FedSM steps the global
        copy, the personalized model and the selector on the same batch).
    batches : callable
        Returns a fresh iterable of ``(images, masks)`` for each epoch.
    epochs : int
        Passes over the local data.
    max_steps : int
        Stop after this many minibatches in total; 0 means no limit.
    device : torch.device or str
        Where the batches are moved (from pinned memory, without blocking, on CUDA).
    precision : str
        One of :data:`fedsm_core.training.precision.PRECISIONS`; ``auto`` is
        resolved for ``device``. Each learner gets its own gradient scaler
        under ``fp16``.

    Returns
    -------
    dict[str, float]
        ``loss-<name>`` (mean data loss per learner) and ``steps``.
    """
    if not learners:
        raise ValueError("train_local: no learners given")
    amps = [step_precision(precision, device) for _ in learners]
    # Losses stay on the device until the end: reading one per step would make the CPU wait for the GPU.
    sums: dict[str, torch.Tensor | float] = {learner.name: 0.0 for learner in learners}
    steps = 0
    for _ in range(epochs):
        for images, masks in batches():
            images, masks = to_device(images, device), to_device(masks, device)
            for learner, amp in zip(learners, amps, strict=True):
                loss = learner.step(images, masks, amp)
                sums[learner.name] = sums[learner.name] + loss.detach().to(torch.float64)
            steps += 1
            if 0 < max_steps <= steps:
                break
        if 0 < max_steps <= steps:
            break
    metrics = {f"loss-{name}": float(total) / max(steps, 1) for name, total in sums.items()}
    metrics["steps"] = float(steps)
    return metrics


def stretch_to_min_steps(count: int, batch_size: int, epochs: int, max_steps: int, min_steps: int) -> tuple[int, int]:
    """``(epochs, step cap)`` of a round that takes at least ``min_steps`` minibatches (``min-local-steps``).

    A site whose round (``epochs`` passes of ``p`` minibatches, capped at
    ``max_steps``) is shorter than ``min_steps`` takes exactly ``min_steps``:
    ``ceil(min_steps / p)`` passes capped at ``min_steps``, as ``local-steps``
    would. A longer round is left as it is, so a federation whose every site
    takes ``min_steps`` or more trains as without the setting.
    """
    per_pass = batches_per_pass(count, batch_size)
    planned = per_pass * epochs if max_steps == 0 else min(per_pass * epochs, max_steps)
    if min_steps <= planned:
        return epochs, max_steps
    return -(-min_steps // per_pass), min_steps


def train_on_split(
    learners: Sequence[Learner],
    data: SegArrays,
    batch_size: int,
    epochs: int,
    max_steps: int,
    seed: int,
    device: torch.device | str = "cpu",
    augmentation: str = "flip",
    precision: str = "fp32",
    min_steps: int = 0,
) -> dict[str, float]:
    """:func:`train_local` over shuffled, augmented minibatches of one site's split.

    ``seed`` fixes the order and augmentation, so a round is reproducible;
    ``augmentation`` is a policy of :mod:`fedsm_core.data.augment`;
    ``precision`` is passed to :func:`train_local`; ``min_steps`` stretches
    a round too short for it (:func:`stretch_to_min_steps`).
    """
    epochs, max_steps = stretch_to_min_steps(len(data.images), batch_size, epochs, max_steps, min_steps)
    generator = torch.Generator().manual_seed(seed)
    return train_local(
        learners,
        lambda: iterate_batches(data, batch_size, shuffle=True, augment=augmentation, generator=generator),
        epochs,
        max_steps,
        device,
        precision,
    )
