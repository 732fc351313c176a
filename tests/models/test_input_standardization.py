"""Per-image input standardization: the hand-computed values, the style changes it removes, and the model spec."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedsm_core.config import RunConfig
from fedsm_core.models.input_standardization import InputStandardized, standardize_images
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights, set_weights


def test_standardize_by_hand_in_float64():
    # Prepare: one image, two channels of four pixels
    images = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]], [[5.0, 5.0], [5.0, 5.0]]]], dtype=torch.float64)

    # Execute
    out = standardize_images(images, eps=1e-300)  # eps small enough to leave channel 0 exact

    # Assert: channel 0 has mean 2.5 and variance 1.25, so (x - 2.5) / sqrt(1.25); a constant channel becomes 0
    expected = torch.tensor([-1.5, -0.5, 0.5, 1.5], dtype=torch.float64) / 1.25 ** 0.5
    torch.testing.assert_close(out[0, 0].flatten(), expected, rtol=1e-12, atol=0)
    assert torch.count_nonzero(out[0, 1]) == 0


def test_brightness_contrast_and_colour_gains_leave_the_standardized_image_unchanged():
    # Prepare
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(3, 3, 16, 16, generator=generator, dtype=torch.float64)
    gains = torch.tensor([1.3, 0.7, 1.1], dtype=torch.float64).view(1, 3, 1, 1)

    # Execute: a contrast scale, a brightness offset and per-channel gains, as a site's camera would add
    restyled = (images * 0.6 + 0.25) * gains

    # Assert: the same input reaches the network (eps makes it agree to about 1e-5 relative)
    torch.testing.assert_close(standardize_images(restyled), standardize_images(images), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(restyled, images)


def test_the_spec_puts_the_layer_in_front_of_every_u_net_and_the_weights_are_the_networks():
    # Prepare
    plain = ModelSpec("mobilenet_v2", 2, 3)
    standardized = dataclasses.replace(plain, input_norm="per-image")
    torch.manual_seed(0)
    net = plain.build_segmentation()

    # Execute
    model = standardized.build_segmentation()
    set_weights(model, {f"net.{key}": value for key, value in get_weights(net).items()})

    # Assert: the same network behind the layer, no weights of its own, and a spec that round-trips
    assert isinstance(model, InputStandardized)
    images = torch.rand(2, 3, 32, 32)
    net.eval(), model.eval()
    torch.testing.assert_close(model(images), net(standardize_images(images)))
    assert set(get_weights(model)) == {f"net.{key}" for key in get_weights(net)}
    assert ModelSpec(**standardized.to_dict()) == standardized


def test_the_run_setting_reaches_the_spec_and_a_bad_value_is_named():
    assert RunConfig.from_mapping({"input-norm": "per-image"}).model_spec(2, 6).input_norm == "per-image"
    assert RunConfig.from_mapping({"input-norm": "none"}).model_spec(2, 6).input_norm == "none"
    with pytest.raises(ValueError, match="input-norm = 'per-site' is not one of"):
        RunConfig.from_mapping({"input-norm": "per-site"})

