"""The selector head fitted from site statistics: LDA math, statistics, and why it fixes one-label sites."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedsm_core.algorithms.fedsm.client import site_batch
from fedsm_core.algorithms.fedsm.fedsm import FedSM
from fedsm_core.algorithms.fedsm.selector_head import (
    CLOSED_BIAS,
    HEAD_BIAS,
    HEAD_WEIGHT,
    SelectorStatistics,
    fit_selector_head,
    selector_statistics,
    views_per_image,
    with_fitted_head,
)
from fedsm_core.data.arrays import SegArrays
from fedsm_core.models.selector import Selector
from fedsm_core.models.weights import get_weights, set_weights


def _arrays(images: torch.Tensor) -> SegArrays:
    """A split of these images with empty masks (the selector never looks at masks)."""
    masks = np.zeros((len(images), 1, *images.shape[2:]), dtype=np.float32)
    return SegArrays(images.numpy(), masks, tuple(f"image-{i}" for i in range(len(images))))


def _stats(points: list[list[float]]) -> SelectorStatistics:
    z = np.array(points, dtype=np.float64)
    return SelectorStatistics(float(len(z)), z.sum(axis=0), z.T @ z)


def test_lda_head_matches_the_hand_computed_solution():
    # Prepare: site A {(1, 1), (1, -1)}, site B {(-1, 1), (-1, -1)}
    # means (1, 0) and (-1, 0); within scatter of each site [[0, 0], [0, 2]], so S = [[0, 0], [0, 4]] / 4
    # shrinkage 0.5: tr(S) / 2 = 0.5, S_a = 0.5 S + 0.5 * 0.5 I = [[0.25, 0], [0, 0.75]]
    # W_A = S_a^-1 (1, 0) = (4, 0), b_A = -1/2 * (4 * 1) = -2; W_B = (-4, 0), b_B = -2
    statistics = [_stats([[1, 1], [1, -1]]), _stats([[-1, 1], [-1, -1]])]

    # Execute
    weight, bias = fit_selector_head(statistics, shrinkage=0.5)

    # Assert
    np.testing.assert_allclose(weight, [[4.0, 0.0], [-4.0, 0.0]])
    np.testing.assert_allclose(bias, [-2.0, -2.0])


def test_lda_head_reduces_to_nearest_mean_with_full_shrinkage_and_isotropic_spread():
    # shrinkage 1: S_a = (tr(S) / D) I = s I, so logit_k = (mu_k . z - |mu_k|^2 / 2) / s: nearest mean wins
    statistics = [_stats([[2, 0], [4, 0], [3, 1], [3, -1]]), _stats([[0, 3], [0, 5], [1, 4], [-1, 4]])]
    weight, bias = fit_selector_head(statistics, shrinkage=1.0)
    means = np.array([[3.0, 0.0], [0.0, 4.0]])
    scale = np.trace(sum(s.gram - s.count * np.outer(m, m) for s, m in zip(statistics, means, strict=True))) / 8 / 2
    np.testing.assert_allclose(weight, means / scale)
    np.testing.assert_allclose(bias, -0.5 * (means**2).sum(axis=1) / scale)


@pytest.mark.parametrize("shrinkage", [-0.1, 1.5])
def test_shrinkage_outside_the_unit_interval_is_refused(shrinkage):
    statistics = [_stats([[1, 1]]), _stats([[0, 1]])]
    with pytest.raises(ValueError, match="selector-shrinkage"):
        fit_selector_head(statistics, shrinkage)


def test_statistics_round_trip_and_reject_bad_shapes():
    statistics = _stats([[1, 2, 3], [4, 5, 6]])
    back = SelectorStatistics.from_arrays(statistics.to_arrays())
    assert back.count == 2.0
    np.testing.assert_array_equal(back.gram, statistics.gram)
    with pytest.raises(ValueError, match="lack"):
        SelectorStatistics.from_arrays({"count": np.array([2.0]), "sum": np.zeros(3)})
    with pytest.raises(ValueError, match="expected"):
        SelectorStatistics(2.0, np.zeros(3), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="count"):
        SelectorStatistics(0.0, np.zeros(2), np.zeros((2, 2)))


def test_selector_statistics_are_the_sums_over_the_images_and_their_flips():
    # Prepare
    torch.manual_seed(0)
    selector = Selector(num_sites=2, width=2)
    images = torch.rand(3, 3, 32, 32)
    data = _arrays(images)

    # Execute
    statistics = selector_statistics(selector, data, flips=True, batch_size=2)

    # Assert: four views per image, summed in float64
    with torch.no_grad():
        views = torch.cat([images, images.flip(-1), images.flip(-2), images.flip(-1, -2)])
        z = selector.embed(views).double().numpy()
    assert statistics.count == 12
    np.testing.assert_allclose(statistics.total, z.sum(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(statistics.gram, z.T @ z, rtol=1e-5, atol=1e-4)
    assert selector_statistics(selector, data, flips=False).count == 3


def _style_sites(num_sites: int = 3, per_site: int = 12) -> list[torch.Tensor]:
    """Sites that differ only in acquisition: a colour gain and a brightness offset on shared content."""
    generator = torch.Generator().manual_seed(1)
    content = torch.rand(per_site * num_sites, 1, 32, 32, generator=generator).repeat(1, 3, 1, 1)
    gains = torch.tensor([[1.0, 0.8, 0.7], [0.7, 1.0, 0.8], [0.8, 0.7, 1.0]])[:num_sites]
    return [(content[k * per_site:(k + 1) * per_site] * gains[k].view(1, 3, 1, 1)).clamp(0, 1)
            for k in range(num_sites)]


def _accuracy(selector: Selector, sites: list[torch.Tensor]) -> float:
    with torch.no_grad():
        hits = [(selector(x).argmax(dim=1) == k).float().mean().item() for k, x in enumerate(sites)]
    return float(np.mean(hits))


def _federated_rounds(selector: Selector, sites: list[torch.Tensor], rounds: int) -> None:
    """FedAvg of the selector where every site trains only on its own label (Algorithm 1), no negatives."""
    for _ in range(rounds):
        replies = []
        for k, x in enumerate(sites):
            local = Selector(len(sites), 2)
            local.load_state_dict(selector.state_dict())
            optimizer = torch.optim.Adam(local.parameters(), lr=1e-2)
            inputs, targets = site_batch(k, len(sites), negatives=False)(x, x)
            for _ in range(3):
                optimizer.zero_grad()
                F.cross_entropy(local(inputs), targets).backward()
                optimizer.step()
            replies.append(get_weights(local))
        set_weights(selector, {key: np.mean([r[key] for r in replies], axis=0) for key in replies[0]}, "selector")


@pytest.fixture
def one_thread():
    """Tiny models train fastest on one thread; on a busy machine two made this test 15 times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_one_label_sites_average_to_a_poor_head_that_the_fitted_head_repairs(one_thread):
    # Prepare: the failure this module fixes: every site shows only its own label
    torch.manual_seed(0)
    sites = _style_sites()
    selector = Selector(num_sites=3, width=2)
    _federated_rounds(selector, sites, rounds=5)
    trained_accuracy = _accuracy(selector, sites)

    # Execute: refit only the head from each site's embedding sums; the trunk is unchanged
    data = [_arrays(x) for x in sites]
    fitted = with_fitted_head(get_weights(selector), [selector_statistics(selector, d) for d in data], 0.1)
    set_weights(selector, fitted, "selector")

    # Assert: the same features separate the sites once the head sees every site's statistics
    assert trained_accuracy < 0.9
    assert _accuracy(selector, sites) == 1.0


def _two_clusters(dim: int) -> tuple[SelectorStatistics, SelectorStatistics]:
    """Two embeddings per site, mean +1 (first) or -1 (second) in every dimension, unit within-site spread."""
    gram = 2 * (np.ones((dim, dim)) + np.eye(dim))
    return SelectorStatistics(2.0, 2 * np.ones(dim), gram), SelectorStatistics(2.0, -2 * np.ones(dim), gram)


def test_fedsm_fits_the_head_from_two_or_more_sites_in_the_selectors_order():
    # Prepare
    selector = Selector(num_sites=2, width=2)
    fedsm = FedSM(["a", "b"], {"w": np.zeros(1)}, get_weights(selector), lam=0.5)
    dim = selector.feature_dim
    before = {key: value.copy() for key, value in fedsm.selector_weights.items()}
    a, b = _two_clusters(dim)

    # Execute / Assert: one site of two is too few to fit, and leaves the selector as it was
    with pytest.raises(ValueError, match=r"statistics from \['a'\] only"):
        fedsm.fit_selector_head({"a": a}, 0.1)
    for key, value in before.items():
        np.testing.assert_array_equal(fedsm.selector_weights[key], value)
    assert fedsm.fit_selector_head({"b": b, "a": a}, 0.1) == []
    weight = fedsm.selector_weights[HEAD_WEIGHT]
    assert weight.dtype == np.float32 and weight.shape == (2, dim)
    # site order is the selector's, not the mapping's: row 0 points towards a's mean (+1)
    assert weight[0].sum() > 0 > weight[1].sum()
    np.testing.assert_allclose(fedsm.selector_weights[HEAD_BIAS][0], fedsm.selector_weights[HEAD_BIAS][1])
    np.testing.assert_array_equal(fedsm.selector_weights["features.0.weight"], before["features.0.weight"])


def test_a_site_without_accepted_statistics_gets_a_closed_route_and_the_others_their_fit():
    # Prepare: three sites; c's statistics were rejected (or never came)
    selector = Selector(num_sites=3, width=2)
    fedsm = FedSM(["a", "c", "b"], {"w": np.zeros(1)}, get_weights(selector), lam=0.5)
    dim = selector.feature_dim
    a, b = _two_clusters(dim)
    two_site = fit_selector_head([a, b], 0.1)

    # Execute
    closed = fedsm.fit_selector_head({"a": a, "b": b}, 0.1)

    # Assert: a and b get the head a two-site fit gives; c's row routes nothing, whatever the embedding
    assert closed == ["c"]
    weight, bias = fedsm.selector_weights[HEAD_WEIGHT], fedsm.selector_weights[HEAD_BIAS]
    np.testing.assert_allclose(weight[[0, 2]], two_site[0].astype(np.float32))
    np.testing.assert_allclose(bias[[0, 2]], two_site[1].astype(np.float32))
    assert not weight[1].any() and bias[1] == np.float32(CLOSED_BIAS)
    set_weights(selector, fedsm.selector_weights, "selector")
    with torch.no_grad():
        logits = torch.from_numpy(np.random.default_rng(0).normal(size=(16, dim)).astype(np.float32)) \
            @ torch.from_numpy(weight).T + torch.from_numpy(bias)
    assert torch.softmax(logits, dim=1)[:, 1].max() == 0.0 and torch.isfinite(torch.log_softmax(logits, 1)).all()


def test_a_head_for_another_selector_is_refused():
    selector = Selector(num_sites=3, width=2)
    statistics = [_stats([[1, 1]]), _stats([[0, 1]])]
    with pytest.raises(ValueError, match="another selector"):
        with_fitted_head(get_weights(selector), statistics, 0.1)


def test_statistics_that_real_embeddings_cannot_have_are_refused():
    # Prepare: two embeddings (1, 0) and (0, 1): n = 2, s = (1, 1), G = I
    honest = {"count": np.array([2.0]), "sum": np.array([1.0, 1.0]), "gram": np.eye(2)}
    SelectorStatistics.from_arrays(honest)  # the scatter I - s s^T / 2 has eigenvalues 1 and 0

    # Assert: an asymmetric Gram matrix, and a Gram matrix too small for its sum (scatter eigenvalue -0.5)
    with pytest.raises(ValueError, match="not symmetric"):
        SelectorStatistics.from_arrays({**honest, "gram": np.array([[1.0, 0.5], [0.0, 1.0]])})
    with pytest.raises(ValueError, match=r"eigenvalue -0.5 < 0"):
        SelectorStatistics.from_arrays({**honest, "gram": np.eye(2) * 0.5})


def test_a_count_other_than_the_reported_images_times_the_views_is_refused():
    statistics = SelectorStatistics(8.0, np.zeros(2), np.eye(2))
    statistics.check_count(2 * views_per_image(flips=True))  # two images, four views each
    with pytest.raises(ValueError, match="count 8 embeddings, expected 3"):
        statistics.check_count(3 * views_per_image(flips=False))
