"""Only the personalized models a site's images can be routed to travel, and the results do not change."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedsm_core.algorithms.fedsm.needed_models import candidate_models, needed_models
from fedsm_core.algorithms.fedsm.super_model import MissingModel, assemble_super_model
from fedsm_core.data.arrays import SegArrays
from fedsm_core.evaluation.super_model_evaluation import evaluate_super_model
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights


class FixedSelector(nn.Module):
    """Logits chosen per image by its mean intensity bucket, so the routes are known in advance."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        bucket = (images.mean(dim=(1, 2, 3)) * len(self.table)).long().clamp(0, len(self.table) - 1)
        return self.table[bucket]


def _data(means: list[float]) -> SegArrays:
    images = np.stack([np.full((3, 32, 32), m, dtype=np.float32) for m in means])
    masks = np.zeros((len(means), 2, 32, 32), dtype=np.float32)
    masks[:, :, 8:24, 8:24] = 1.0
    return SegArrays(images, masks, tuple(f"x/{i}" for i in range(len(means))))


def test_candidates_are_the_argmax_or_argmax_minus_one_with_a_global_output():
    probs = torch.tensor([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]])
    assert candidate_models(probs).tolist() == [1, 0]
    assert candidate_models(probs, selector_includes_global=True).tolist() == [0, -1]


def test_a_site_needs_its_own_model_and_every_images_argmax():
    # buckets of mean intensity 0-0.25, .., 0.75-1 -> argmax sites 2, 2, 0, 3 of K = 4
    table = torch.tensor([[0.0, 0.0, 5.0, 0.0], [0.0, 0.0, 5.0, 0.0], [5.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    data = _data([0.1, 0.3, 0.6])  # buckets 0, 1, 2 -> sites 2, 2, 0
    assert needed_models(FixedSelector(table), data, 1, False, batch_size=2) == [0, 1, 2]
    assert needed_models(FixedSelector(table), data, None, False, batch_size=2) == [0, 2]
    # FedSM-extra: output 0 is the global model, so bucket 2's argmax 0 needs no personalized model
    assert needed_models(FixedSelector(table), data, 1, True, batch_size=2) == [1]


def test_a_missing_model_says_it_was_not_sent():
    with pytest.raises(RuntimeError, match="personalized model 3 was not sent"):
        MissingModel(3)(torch.zeros(1, 3, 8, 8))


def test_evaluating_with_only_the_needed_models_gives_the_same_metrics():
    # Prepare: K = 3 tiny U-Nets; the selector routes every image of this site (1) to models 1 and 2
    torch.manual_seed(0)
    spec = ModelSpec("mobilenet_v2", num_structures=2, num_sites=3, selector_width=4)
    models = [get_weights(spec.build_segmentation()) for _ in range(4)]
    selector = spec.build_selector()
    table = torch.tensor([[0.0, 4.0, 0.0], [0.0, 0.0, 4.0]])
    data = _data([0.2, 0.7, 0.9])
    needed = needed_models(FixedSelector(table), data, 1, False, batch_size=2)
    full = assemble_super_model(spec, models[0], models[1:], get_weights(selector), 0.3)
    part = assemble_super_model(spec, models[0], [w if k in needed else None for k, w in enumerate(models[1:])],
                                get_weights(selector), 0.3)
    full.selector = part.selector = FixedSelector(table)

    # Execute
    everything = evaluate_super_model(full, 1, data, 2, "cpu", [0.0, 0.5, 0.99])
    only_needed = evaluate_super_model(part, 1, data, 2, "cpu", [0.0, 0.5, 0.99])

    # Assert
    assert needed == [1, 2] and isinstance(part.personalized[0], MissingModel)
    assert only_needed == everything
