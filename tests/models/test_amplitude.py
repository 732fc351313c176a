"""HarmoFL's amplitude normalization layer."""

from __future__ import annotations

import pytest
import torch

from fedsm_core.models.amplitude import AmplitudeNormalization, low_frequency_mask, replace_amplitude


def _images(seed: int, n: int = 2) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_an_image_with_its_own_amplitude_comes_back_unchanged():
    images = _images(0, n=1)
    own = torch.fft.fft2(images)[0].abs()
    torch.testing.assert_close(replace_amplitude(images, own), images, rtol=0, atol=1e-12)


def test_the_output_has_the_target_amplitude_and_the_input_phase():
    images = _images(1, n=1)
    target = torch.fft.fft2(_images(2, n=1))[0].abs()
    out = torch.fft.fft2(replace_amplitude(images, target))[0]
    torch.testing.assert_close(out.abs(), target, rtol=1e-9, atol=1e-9)
    phase_in, phase_out = torch.angle(torch.fft.fft2(images)[0]), torch.angle(out)
    # Phases agree modulo 2 pi
    torch.testing.assert_close(torch.cos(phase_out - phase_in), torch.ones_like(phase_in), rtol=0, atol=1e-9)


def test_a_dc_window_changes_only_the_mean_of_each_channel():
    images = _images(3, n=1)
    target = torch.fft.fft2(_images(4, n=1))[0].abs()
    out = replace_amplitude(images, target, window=1)
    centred_in = images - images.mean(dim=(2, 3), keepdim=True)
    centred_out = out - out.mean(dim=(2, 3), keepdim=True)
    torch.testing.assert_close(centred_out, centred_in, rtol=0, atol=1e-12)
    assert int(low_frequency_mask(8, 8, 1).sum()) == 1
    assert int(low_frequency_mask(8, 8, 2).sum()) == 9  # |u| < 2 and |v| < 2: 3 x 3 frequencies
    assert bool(low_frequency_mask(8, 8, 0).all())


def test_the_running_average_follows_the_formula_on_two_batches():
    layer = AmplitudeNormalization(channels=3, decay=0.25).train()
    first, second = _images(5).float(), _images(6).float()
    layer(first)
    layer(second)
    a1 = 0.25 * torch.fft.fft2(first).abs().mean(dim=0)  # A_0 = 0
    a2 = 0.75 * a1 + 0.25 * torch.fft.fft2(second).abs().mean(dim=0)
    torch.testing.assert_close(layer.amplitude, a2, rtol=1e-5, atol=1e-5)
    assert int(layer.batches) == 2


def test_evaluation_and_a_frozen_amplitude_never_update_it():
    layer = AmplitudeNormalization(channels=3, decay=0.5).train()
    layer(_images(7).float())
    before = layer.amplitude.clone()
    layer.eval()(_images(8).float())
    torch.testing.assert_close(layer.amplitude, before)
    fixed = torch.ones(3, 8, 8)
    layer.train().freeze(fixed)
    out = layer(_images(9).float())
    torch.testing.assert_close(layer.amplitude, fixed)
    torch.testing.assert_close(torch.fft.fft2(out).abs(), torch.ones(2, 3, 8, 8), rtol=1e-4, atol=1e-4)


def test_bad_settings_and_shapes_are_refused():
    with pytest.raises(ValueError, match="decay"):
        AmplitudeNormalization(decay=0.0)
    with pytest.raises(ValueError, match="window"):
        AmplitudeNormalization(window=-1)
    layer = AmplitudeNormalization(channels=3).train()
    layer(torch.rand(1, 3, 8, 8))
    with pytest.raises(ValueError, match="one size"):
        layer(torch.rand(1, 3, 16, 16))
    with pytest.raises(ValueError, match="channels"):
        layer(torch.rand(1, 1, 8, 8))
