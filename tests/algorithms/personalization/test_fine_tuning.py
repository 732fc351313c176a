"""FT in a full FedSM client round (U-Net at 32x32): the global model fine-tuned on the same batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsm_core.algorithms.fedsm.client import train_fedsm_client
from fedsm_core.algorithms.fedsm.fedsm import FedSMPayload
from fedsm_core.algorithms.personalization.settings import PersonalizationSettings
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.losses import soft_dice_loss
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights, set_weights
from fedsm_core.training.local_update import Learner, train_on_split
from fedsm_core.training.optimizer_state import new_adam

SPEC = ModelSpec("mobilenet_v2", 2, 3, selector_width=4)


def _site() -> SegArrays:
    rng = np.random.default_rng(0)
    return SegArrays(rng.random((6, 3, 32, 32), dtype=np.float32),
                     (rng.random((6, 2, 32, 32)) > 0.5).astype(np.float32), tuple(f"x/{i}" for i in range(6)))


def _reference(start_weights, data: SegArrays, settings: RoundSettings):
    """Plain Adam on the soft Dice loss from ``start_weights``, on the round's batches."""
    model = SPEC.build_segmentation()
    set_weights(model, start_weights)
    learner = Learner("reference", model, new_adam(model.parameters(), settings.lr), soft_dice_loss)
    train_on_split([learner], data, settings.batch_size, settings.local_epochs, settings.max_local_steps,
                   settings.seed, "cpu", settings.augmentation)
    return get_weights(model)


@pytest.mark.parametrize(("method", "starts_from"), [("ft", "global"), ("softpull", "personal")])
def test_personalized_model_is_the_start_model_trained_on_the_same_batches(method, starts_from):
    # Prepare: distinct global and personalized models, so the start each method takes shows
    torch.manual_seed(0)
    global_weights, selector = get_weights(SPEC.build_segmentation()), get_weights(SPEC.build_selector())
    personal_weights = get_weights(SPEC.build_segmentation())
    settings = RoundSettings(batch_size=4, local_epochs=1, max_local_steps=0, lr=1e-3, selector_lr=1e-3, seed=3,
                             personalization=PersonalizationSettings(method))
    data = _site()

    # Execute
    update, _ = train_fedsm_client(FedSMPayload(global_weights, personal_weights, selector, {}), 1, data, SPEC,
                                   settings, torch.device("cpu"))

    # Assert
    expected = _reference(global_weights if starts_from == "global" else personal_weights, data, settings)
    for key, value in expected.items():
        np.testing.assert_allclose(update.personal_weights[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
    assert update.client_state == {}
