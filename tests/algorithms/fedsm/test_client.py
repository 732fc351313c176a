"""FedSM client side: selector batches with site-contrast negatives, and one local round."""

from __future__ import annotations

import numpy as np
import torch

from fedsm_core.algorithms.fedsm.fedsm import FedSMPayload
from fedsm_core.algorithms.fedsm.client import TrainSettings, site_batch, train_fedsm_client
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
    settings = TrainSettings(batch_size=4, local_epochs=1, max_local_steps=0, lr=1e-3, selector_lr=1e-3, seed=0)

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


def test_a_local_round_lowers_the_selector_loss_on_the_images_it_trained_on():
    # Prepare: site 1 of 3; the loss is Algorithm 1's, cross-entropy against one_hot(1) on the site's images
    torch.set_num_threads(1)
    spec = ModelSpec("mobilenet_v2", num_structures=2, num_sites=3, selector_width=4)
    torch.manual_seed(0)
    segmentation, selector = get_weights(spec.build_segmentation()), get_weights(spec.build_selector())
    rng = np.random.default_rng(1)
    data = SegArrays(rng.random((8, 3, 32, 32), dtype=np.float32),
                     (rng.random((8, 2, 32, 32)) > 0.5).astype(np.float32), tuple(f"x/{i}" for i in range(8)))
    settings = TrainSettings(batch_size=4, local_epochs=5, max_local_steps=0, lr=1e-3, selector_lr=1e-2, seed=0,
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
