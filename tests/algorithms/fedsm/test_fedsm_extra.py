"""FedSM-extra: selector targets are the argmin-loss model; routing without gamma."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedsm_core.algorithms.fedsm.fedsm_extra import (
    best_model_targets,
    candidate_losses,
    extra_selector_batch,
    route_extra,
)


class Constant(nn.Module):
    """Predicts the same logit map for every image."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("logits", logits)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(len(images), *self.logits.shape)


def _masks() -> torch.Tensor:
    # image 0: left column foreground; image 1: right column foreground (1 structure, 2x2)
    return torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]], [[[0.0, 1.0], [0.0, 1.0]]]])


def test_targets_pick_the_model_with_the_lowest_loss_per_image():
    # Prepare: global predicts nothing useful (all 0.5); personalized 1 predicts the left
    # column, personalized 2 the right column. Index 0 = global, 1..K = personalized.
    strong = 20.0
    left = torch.tensor([[[strong, -strong], [strong, -strong]]])
    right = torch.tensor([[[-strong, strong], [-strong, strong]]])
    candidates = [Constant(torch.zeros(1, 2, 2)), Constant(left), Constant(right)]
    images = torch.zeros(2, 3, 2, 2)

    # Execute
    losses = candidate_losses(candidates, images, _masks())
    inputs, targets = extra_selector_batch(candidates)(images, _masks())

    # Assert
    assert losses.shape == (2, 3)
    # image 0 matches model 1 exactly (loss ~0), image 1 matches model 2
    assert targets.tolist() == [1, 2]
    assert inputs is images
    assert losses[0, 1] < 1e-6 and losses[1, 2] < 1e-6


def test_ties_go_to_the_global_model():
    assert best_model_targets(torch.tensor([[0.3, 0.3, 0.5], [0.2, 0.1, 0.1]])).tolist() == [0, 1]


def test_route_extra_maps_index_zero_to_the_global_model():
    logits = torch.tensor([[5.0, 1.0, 0.0], [0.0, 1.0, 5.0]])
    assert route_extra(logits).tolist() == [-1, 1]


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="got shape"):
        best_model_targets(torch.zeros(3))
    with pytest.raises(ValueError, match="K \\+ 1"):
        route_extra(torch.zeros(2, 1))
