"""FedSM client side: selector batches with site-contrast negatives, and one local round."""

from __future__ import annotations

import numpy as np
import torch

from fedsm_core.algorithms.baselines.global_client import GlobalClientOptions, train_global_client
from fedsm_core.algorithms.fedsm.client import site_batch, train_fedsm_client
from fedsm_core.algorithms.fedsm.fedsm import FedSMPayload
from fedsm_core.algorithms.round_settings import RoundSettings
from fedsm_core.data.arrays import SegArrays
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights


def test_site_batch_without_negatives_is_one_hot_of_the_site():
    images = torch.rand(3, 3, 8, 8)
    inputs, targets = site_batch(2, 4, negatives=False)(images, torch.zeros(3, 1, 8, 8))
    assert inputs is images
    assert torch.equal(targets, torch.tensor([[0.0, 0.0, 1.0, 0.0]] * 3))


def test_site_batch_negatives_are_restyled_copies_labelled_as_any_other_site():
    # Prepare
    images = torch.rand(2, 3, 8, 8)

    # Execute
    inputs, targets = site_batch(0, 3, negatives=True, generator=torch.Generator().manual_seed(0))(images, None)

    # Assert
    assert inputs.shape == (4, 3, 8, 8)
    assert torch.equal(inputs[:2], images) and not torch.equal(inputs[2:], images)
    # negatives: (1 - one_hot(0)) / (K - 1) = [0, 1/2, 1/2]
    assert torch.allclose(targets, torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0, 0.5, 0.5], [0, 0.5, 0.5]]))


def test_one_site_has_no_negatives():
    inputs, targets = site_batch(0, 1, negatives=True)(torch.rand(2, 3, 8, 8), None)
    assert inputs.shape[0] == 2 and torch.equal(targets, torch.ones(2, 1))


def test_local_round_steps_every_model_and_reports_the_site_size():
    # Prepare
    spec = ModelSpec("mobilenet_v2", num_structures=2, num_sites=3, selector_width=4)
    torch.manual_seed(0)
    segmentation, selector = get_weights(spec.build_segmentation()), get_weights(spec.build_selector())
    rng = np.random.default_rng(0)
    data = SegArrays(
        rng.random((6, 3, 32, 32), dtype=np.float32),
        (rng.random((6, 2, 32, 32)) > 0.5).astype(np.float32),
        tuple(f"x/{i}" for i in range(6)),
    )
    settings = RoundSettings(batch_size=4, local_epochs=1, max_local_steps=0, lr=1e-3, selector_lr=1e-3, seed=0)

    # Execute
    update, metrics = train_fedsm_client(
        FedSMPayload(segmentation, segmentation, selector, {}), 1, data, spec, settings, torch.device("cpu")
    )

    # Assert
    assert metrics["steps"] == 2.0  # 6 images in batches of 4: [4, 2]
    assert update.num_examples == 6
    for before, after in ((segmentation, update.global_weights), (segmentation, update.personal_weights),
                          (selector, update.selector_weights)):
        assert any(not np.array_equal(before[k], after[k]) for k in before if before[k].dtype.kind == "f")
    assert float(update.selector_optimizer["classifier.bias/step"]) == 2.0


def _site_start(num_structures: int, images: int, data_seed: int):
    """A spec of 3 sites, its initial segmentation and selector weights (torch seed 0), and random site data."""
    spec = ModelSpec("mobilenet_v2", num_structures=num_structures, num_sites=3, selector_width=4)
    torch.manual_seed(0)
    segmentation, selector = get_weights(spec.build_segmentation()), get_weights(spec.build_selector())
    rng = np.random.default_rng(data_seed)
    data = SegArrays(rng.random((images, 3, 32, 32), dtype=np.float32),
                     (rng.random((images, num_structures, 32, 32)) > 0.5).astype(np.float32),
                     tuple(f"x/{i}" for i in range(images)))
    return spec, segmentation, selector, data


def test_a_local_round_lowers_the_selector_loss_on_the_images_it_trained_on():
    # Prepare: site 1 of 3; the loss is Algorithm 1's, cross-entropy against one_hot(1) on the site's images
    torch.set_num_threads(1)
    spec, segmentation, selector, data = _site_start(num_structures=2, images=8, data_seed=1)
    settings = RoundSettings(batch_size=4, local_epochs=5, max_local_steps=0, lr=1e-3, selector_lr=1e-2, seed=0,
                             selector_negatives=False, augmentation="none")

    def loss(weights) -> float:
        model = spec.build_selector()
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()})
        model.eval()
        with torch.no_grad():
            logits = model(torch.from_numpy(data.images))
        return float(torch.nn.functional.cross_entropy(logits, torch.full((8,), 1)))

    # Execute
    update, _ = train_fedsm_client(FedSMPayload(segmentation, segmentation, selector, {}), 1, data, spec, settings,
                                   torch.device("cpu"))

    # Assert: ten Adam steps toward site 1 make site 1 clearly more likely on these images (start: about ln 3)
    before, after = loss(selector), loss(update.selector_weights)
    assert after < 0.5 * before, (before, after)


def _fedsm_round(spec, payload, data, seed: int, kept):
    settings = RoundSettings(batch_size=4, local_epochs=1, max_local_steps=0, lr=1e-3, selector_lr=1e-3, seed=seed,
                             style_augmentation=0.5)
    return train_fedsm_client(payload, 1, data, spec, settings, torch.device("cpu"), None, kept)[0]


def test_kept_optimizer_state_carries_the_global_copy_and_softpull_model_into_the_next_round():
    # Prepare
    torch.set_num_threads(1)
    spec, segmentation, selector, data = _site_start(num_structures=1, images=6, data_seed=0)
    start = FedSMPayload(segmentation, segmentation, selector, {})

    # Execute: round 1 reset and local; round 2 of local from its round-1 state, and of the single-model client
    reset_1 = _fedsm_round(spec, start, data, 1, None)
    local_1 = _fedsm_round(spec, start, data, 1, {})
    local_2 = _fedsm_round(spec, FedSMPayload(local_1.global_weights, local_1.personal_weights, selector, {}), data, 2,
                           local_1.optimizer_state)
    single = {}
    for server_round, weights in ((1, segmentation), (2, None)):
        settings = RoundSettings(batch_size=4, local_epochs=1, max_local_steps=0, lr=1e-3, selector_lr=1e-3,
                                 seed=server_round, style_augmentation=0.5)
        update, _ = train_global_client(weights if weights is not None else single["update"].weights, data, spec,
                                        settings, GlobalClientOptions(optimizer_state=single.get("state", {})),
                                        torch.device("cpu"))
        single = {"update": update, "state": update.optimizer_state}

    # Assert: the first round is the paper's bit for bit; the state counts both rounds' 2 steps for both models
    assert reset_1.optimizer_state is None
    for key, value in reset_1.global_weights.items():
        np.testing.assert_array_equal(local_1.global_weights[key], value, err_msg=key)
    steps = {key.split(":")[0]: float(v) for key, v in local_2.optimizer_state.items() if key.endswith("/step")}
    assert steps == {"global": 4.0, "personal": 4.0}
    # FedSM's global copy is the single model trained on the same (restyled) batches: with kept state it matches
    for key, value in single["update"].weights.items():
        np.testing.assert_array_equal(local_2.global_weights[key], value, err_msg=key)
