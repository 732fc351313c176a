"""HarmoFL's amplitude normalization layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedsm_core.models.amplitude import (
    AmplitudeNormalization,
    AmplitudeNormalized,
    frozen_statistics,
    low_frequency_mask,
    replace_amplitude,
)
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights


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


def test_the_layer_normalizes_with_the_bias_corrected_average():
    # Prepare: one batch of one image with v = 0.25 -> the buffer holds 0.25 of its amplitude
    layer = AmplitudeNormalization(channels=3, decay=0.25).train()
    image = _images(10, n=1).float()

    # Execute
    out = layer(image)

    # Assert: corrected, the average is the image's own amplitude, so the image comes back
    torch.testing.assert_close(layer.current(), torch.fft.fft2(image)[0].abs(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, image, rtol=1e-4, atol=1e-4)


def test_a_sized_layer_passes_images_through_until_its_first_batch():
    layer = AmplitudeNormalization(channels=3, decay=0.5, size=8).eval()
    assert tuple(layer.amplitude.shape) == (3, 8, 8)
    image = _images(11, n=1).float()
    torch.testing.assert_close(layer(image), image)
    with pytest.raises(ValueError, match="size"):
        AmplitudeNormalization(size=-1)


def test_frozen_statistics_stop_amplitude_and_batch_norm_updates_and_restore_them():
    # Prepare
    layer = AmplitudeNormalization(channels=3, decay=0.5).train()
    norm = nn.BatchNorm2d(3).train()
    model = nn.Sequential(layer, norm)
    model(_images(12).float())
    amplitude, mean = layer.amplitude.clone(), norm.running_mean.clone()

    # Execute
    with frozen_statistics(model):
        model(_images(13).float())

    # Assert
    torch.testing.assert_close(layer.amplitude, amplitude)
    torch.testing.assert_close(norm.running_mean, mean)
    assert int(layer.batches) == 1
    assert layer.tracking and norm.momentum == 0.1
    model(_images(14).float())
    assert int(layer.batches) == 2


def test_a_spec_with_an_amplitude_size_builds_a_normalized_u_net():
    # Prepare
    spec = ModelSpec("mobilenet_v2", 2, 3, amplitude_size=32, amplitude_decay=0.2, amplitude_window=1)

    # Execute
    model = spec.build_segmentation()
    plain = ModelSpec("mobilenet_v2", 2, 3).build_segmentation()

    # Assert
    assert isinstance(model, AmplitudeNormalized)
    assert model.amplitude_norm.decay == 0.2 and model.amplitude_norm.window == 1
    keys = set(get_weights(model))
    assert {"amplitude_norm.amplitude", "amplitude_norm.frozen", "amplitude_norm.batches"} <= keys
    assert {f"net.{key}" for key in get_weights(plain)} == keys - {k for k in keys if k.startswith("amplitude_norm.")}
    assert tuple(model(torch.rand(2, 3, 32, 32)).shape) == (2, 2, 32, 32)
