"""Random acquisition styles for the selector's negatives."""

from __future__ import annotations

import pytest
import torch

from fedsm_core.data.style import randomize_style


def test_style_changes_every_image_but_keeps_shape_and_range():
    # Prepare
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(16, 3, 32, 32, generator=generator) * 0.8 + 0.1

    # Execute
    styled = randomize_style(images, torch.Generator().manual_seed(1))

    # Assert
    assert styled.shape == images.shape
    assert styled.min() >= 0.0 and styled.max() <= 1.0
    per_image_change = (styled - images).abs().mean(dim=(1, 2, 3))
    assert bool((per_image_change > 0.01).all())


def test_style_is_reproducible_with_a_seeded_generator():
    images = torch.rand(4, 3, 16, 16)
    first = randomize_style(images, torch.Generator().manual_seed(5))
    second = randomize_style(images, torch.Generator().manual_seed(5))
    assert torch.equal(first, second)


def test_style_rejects_a_batch_without_channels():
    with pytest.raises(ValueError, match=r"got shape \(3, 16, 16\)"):
        randomize_style(torch.rand(3, 16, 16))
