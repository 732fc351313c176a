"""Random acquisition styles for the selector's negatives."""

from __future__ import annotations

import pytest
import torch

from fedsm_core.data.style import randomize_style, restyled_batch


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


def test_a_restyled_batch_changes_the_chosen_images_only_and_never_the_masks_or_the_batch():
    # Prepare
    images, masks = torch.rand(64, 3, 16, 16), (torch.rand(64, 1, 16, 16) > 0.5).float()
    kept_images, kept_masks = images.clone(), masks.clone()

    # Execute
    none = restyled_batch(0.0, torch.Generator().manual_seed(0))(images, masks)
    half = restyled_batch(0.5, torch.Generator().manual_seed(0))(images, masks)
    again = restyled_batch(0.5, torch.Generator().manual_seed(0))(images, masks)
    every = restyled_batch(1.0, torch.Generator().manual_seed(0))(images, masks)

    # Assert: p = 0 is the batch; p = 1/2 restyles some images of 64 (each at least e^0.05 away), the same ones again
    assert none[0] is images and none[1] is masks
    changed = (half[0] != images).flatten(1).any(1)
    assert 10 < int(changed.sum()) < 54
    assert torch.equal(half[0], again[0])
    assert bool((every[0] != images).flatten(1).any(1).all())
    assert torch.equal(half[1], kept_masks) and torch.equal(images, kept_images)  # nothing modified in place
    with pytest.raises(ValueError, match="style-augmentation = 1.5 is outside"):
        restyled_batch(1.5)
