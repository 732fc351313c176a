"""The segmentation U-Net and its normalization layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedsm_core.models.segmentation import build_segmentation_model, replace_batch_norm


@pytest.mark.parametrize(("structures", "size"), [(2, 32), (1, 64)])
def test_output_has_one_channel_per_structure(structures, size):
    model = build_segmentation_model("mobilenet_v2", structures).eval()
    assert model(torch.rand(2, 3, size, size)).shape == (2, structures, size, size)


def test_group_norm_model_has_no_batch_norm_and_no_running_statistics():
    model = build_segmentation_model("mobilenet_v2", 2, norm="group")
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert not any("running_mean" in key for key in model.state_dict())
    # Same output in train and eval mode: nothing depends on the batch.
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model.train()(images), model.eval()(images), atol=1e-5)


def test_batch_norm_is_kept_on_request():
    model = build_segmentation_model("mobilenet_v2", 2, norm="batch")
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())


def test_group_count_divides_the_channels():
    # 12 channels with at most 8 groups -> 6 groups (largest divisor of 12 not above 8)
    block = replace_batch_norm(nn.Sequential(nn.Conv2d(3, 12, 1), nn.BatchNorm2d(12)))
    assert isinstance(block[1], nn.GroupNorm) and block[1].num_groups == 6


def test_instance_norm_gives_every_channel_its_own_group_and_equals_torchs_instance_norm():
    # Prepare: one instance-norm layer of the U-Net, and torch's InstanceNorm2d with the same scale and shift
    model = build_segmentation_model("mobilenet_v2", 2, norm="instance")
    layer = next(m for m in model.modules() if isinstance(m, nn.GroupNorm))
    torch.manual_seed(0)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 2.0)
        layer.bias.uniform_(-1.0, 1.0)
    reference = nn.InstanceNorm2d(layer.num_channels, eps=layer.eps, affine=True)
    reference.load_state_dict({"weight": layer.weight, "bias": layer.bias})
    features = torch.randn(3, layer.num_channels, 8, 8, dtype=torch.float64) * 4 + 2

    # Execute
    ours, theirs = layer.double()(features), reference.double()(features)

    # Assert: one group per channel in every layer, and torch's instance normalization exactly
    assert all(m.num_groups == m.num_channels for m in model.modules() if isinstance(m, nn.GroupNorm))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"encoder": "no-such-encoder"}, "no-such-encoder"), ({"norm": "layer"}, "segmentation-norm = 'layer'")],
)
def test_bad_settings_are_explained(kwargs, match):
    arguments = {"encoder": "mobilenet_v2", "num_structures": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        build_segmentation_model(**arguments)
