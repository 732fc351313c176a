"""Client side of the single-model strategies: FedAvg, FedProx and SCAFFOLD.

All three train the global model on local data in the one local-training loop;
they differ only in the hook: none (FedAvg), a proximal term (FedProx), or a
control-variate correction (SCAFFOLD).
"""

from __future__ import annotations

import dataclasses

import torch

from fedsm_core.algorithms.baselines.fedprox import ProximalTerm
from fedsm_core.algorithms.baselines.scaffold import ScaffoldCorrection
from fedsm_core.algorithms.fedsm.client import segmentation_batch_fn, segmentation_hooks
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.losses import soft_dice_loss
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import Weights, get_weights
from fedsm_core.training.local_update import Learner, TrainingHook, train_on_split
from fedsm_core.training.optimizer_state import adam_state_to_arrays, load_adam_state, new_adam


@dataclasses.dataclass(frozen=True)
class GlobalClientOptions:
    """What distinguishes FedAvg, FedProx and SCAFFOLD on the client.

    Attributes
    ----------
    proximal_mu : float
        FedProx's ``mu``; 0 adds no term.
    server_control, client_control : dict or None
        SCAFFOLD's ``c`` and ``c_k``; ``None`` trains without correction.
    optimizer_state : dict or None
        Adam's state to start from (``optimizer-state = local``: what this
        site's Adam ended its previous round with); ``None`` starts a fresh Adam.
    """

    proximal_mu: float = 0.0
    server_control: Weights | None = None
    client_control: Weights | None = None
    optimizer_state: Weights | None = None


@dataclasses.dataclass
class GlobalUpdate:
    """A client's reply: trained weights, its size, (SCAFFOLD) its new control variate, and its Adam state."""

    weights: Weights
    num_examples: int
    client_control: Weights | None = None
    optimizer_state: Weights | None = None


def train_global_client(
    global_weights: Weights,
    data: SegArrays,
    spec: ModelSpec,
    settings: RoundSettings,
    options: GlobalClientOptions,
    device: torch.device,
) -> tuple[GlobalUpdate, dict[str, float]]:
    """Local epochs on the global model with the strategy's hook.

    Returns
    -------
    (GlobalUpdate, dict)
        The update for the server and the mean loss / step count.
    """
    model = spec.load_segmentation(global_weights, "global model")
    model.to(device)
    hooks: list[TrainingHook] = segmentation_hooks(settings)
    if options.proximal_mu > 0:
        hooks.append(ProximalTerm(model, options.proximal_mu))
    scaffold = None
    if options.server_control is not None:
        if options.client_control is None:
            raise ValueError("SCAFFOLD needs the client's control variate as well as the server's")
        scaffold = ScaffoldCorrection(options.server_control, options.client_control)
        hooks.append(scaffold)
    optimizer = new_adam(model.parameters(), settings.lr)
    if options.optimizer_state is not None:
        load_adam_state(model, optimizer, options.optimizer_state)
    learner = Learner("global", model, optimizer, soft_dice_loss, segmentation_batch_fn(settings), hooks)
    metrics = train_on_split([learner], data, settings.batch_size, settings.local_epochs,
                             settings.max_local_steps, settings.seed, device,
                             settings.augmentation, settings.precision, settings.min_local_steps)
    control = scaffold.new_client_control(model) if scaffold is not None else None
    kept = adam_state_to_arrays(model, optimizer) if options.optimizer_state is not None else None
    return GlobalUpdate(get_weights(model), len(data.images), control, kept), metrics
