"""The model selector: embedding layout, input standardization, argument checks."""

from __future__ import annotations

import pytest
import torch

from fedsm_core.models.selector import Selector


def _reference_embedding(selector: Selector, images: torch.Tensor) -> torch.Tensor:
    """The embedding written out step by step, in float64: trunk features from scratch, then the style statistics."""
    model = selector.double()
    x = (images.double() - model.input_mean) / model.input_std
    trunk = model.pool(model.features(x)).flatten(1)
    first = torch.relu(model.features[0](x))
    style = [x.mean(dim=(2, 3)), x.std(dim=(2, 3)), first.mean(dim=(2, 3)), first.std(dim=(2, 3))]
    return torch.cat([trunk, *style], dim=1)


def test_embedding_is_the_pooled_trunk_followed_by_style_statistics() -> None:
    torch.manual_seed(0)
    selector = Selector(num_sites=4, width=4).eval()
    selector.set_input_statistics([0.4, 0.5, 0.6], [0.2, 0.25, 0.3])
    images = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        embedding = selector.embed(images)
        expected = _reference_embedding(selector, images)
    assert embedding.shape == (3, selector.feature_dim) == (3, 8 * 4 + 2 * 3 + 2 * 4)
    torch.testing.assert_close(embedding.double(), expected, rtol=1e-5, atol=1e-5)


def test_logits_are_the_linear_head_of_the_embedding() -> None:
    torch.manual_seed(1)
    selector = Selector(num_sites=5, width=2).eval()
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        logits = selector(images)
        expected = selector.embed(images) @ selector.classifier.weight.T + selector.classifier.bias
    assert logits.shape == (2, 5)
    torch.testing.assert_close(logits, expected)


def test_the_first_convolution_gets_the_gradients_of_the_trunk_and_the_style_statistics() -> None:
    torch.manual_seed(2)
    selector = Selector(num_sites=3, width=2)
    images = torch.rand(2, 3, 32, 32)
    weight = selector.features[0].weight
    x = (images - selector.input_mean) / selector.input_std
    trunk = selector.pool(selector.features(x)).flatten(1).sum()
    first = torch.relu(selector.features[0](x))
    style = first.mean(dim=(2, 3)).sum() + first.std(dim=(2, 3)).sum()
    style_grad = torch.autograd.grad(style, weight)[0]
    assert torch.count_nonzero(style_grad) > 0
    expected = torch.autograd.grad(trunk, weight)[0] + style_grad
    torch.testing.assert_close(torch.autograd.grad(selector.embed(images).sum(), weight)[0], expected,
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("kwargs", "message"), [({"num_sites": 0}, "num_sites"), ({"num_sites": 2, "width": 0},
                                                                                     "selector-width")])
def test_bad_arguments_are_named(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Selector(**kwargs)


def test_input_statistics_need_one_positive_std_per_channel() -> None:
    selector = Selector(num_sites=2, width=2)
    with pytest.raises(ValueError, match="positive stds"):
        selector.set_input_statistics([0.5, 0.5, 0.5], [0.2, 0.0, 0.2])
    selector.set_input_statistics([0.1, 0.2, 0.3], [1.0, 2.0, 4.0])
    assert selector.input_std.flatten().tolist() == [1.0, 2.0, 4.0]
