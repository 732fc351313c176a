"""Site regions in the selector's embedding: hand-computed distances, radius and gate."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.analysis.familiarity import SiteRegions, fit_site_regions
from fedsm_core.analysis.gamma_calibration import gated_routes

SITES = ("a", "b")


def test_means_pooled_covariance_and_radius_by_hand():
    # a's training embeddings (0, +-1), b's (4, +-1): means (0, 0), (4, 0); pooled covariance diag(0, 1);
    # shrinkage 0.5 toward tr / D = 0.5: diag(0.25, 0.75), precision diag(4, 4/3).
    train = {"a": np.array([[0.0, 1.0], [0.0, -1.0]]), "b": np.array([[4.0, 1.0], [4.0, -1.0]])}
    # validation: a at (0.5, 0) -> d_a = 4 * 0.25 = 1; b at (4, 1.5) -> d_b = 4/3 * 2.25 = 3
    val = {"a": np.array([[0.5, 0.0]]), "b": np.array([[4.0, 1.5]])}

    regions = fit_site_regions(train, val, SITES, shrinkage=0.5)

    np.testing.assert_allclose(regions.means, [[0.0, 0.0], [4.0, 0.0]])
    np.testing.assert_allclose(regions.precision, np.diag([4.0, 4.0 / 3.0]))
    assert regions.radius == pytest.approx(3.0)
    # (2, 0) is at distance 16 from both means
    np.testing.assert_allclose(regions.distances(np.array([[2.0, 0.0]])), [[16.0, 16.0]])


def test_only_images_within_the_radius_of_their_chosen_site_are_familiar():
    regions = SiteRegions(np.array([[0.0, 0.0], [4.0, 0.0]]), np.eye(2), 1.0)
    features = np.array([[0.5, 0.5], [3.5, 0.0], [2.0, 0.0], [0.0, 0.0]])
    # chosen sites: a (d 0.5), b (d 0.25), a (d 4), global (-1)
    assert regions.familiar(features, np.array([0, 1, 0, -1])).tolist() == [True, True, False, False]


def test_gated_routes_send_unfamiliar_images_to_the_global_model():
    regions = SiteRegions(np.array([[0.0, 0.0], [4.0, 0.0]]), np.eye(2), 1.0)
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.95, 0.05]])
    features = np.array([[0.0, 0.5], [4.0, 0.0], [10.0, 10.0]])  # the last is far from both sites

    assert gated_routes(probs, 0.5, features, None).tolist() == [0, 1, 0]
    assert gated_routes(probs, 0.5, features, regions).tolist() == [0, 1, -1]
    assert gated_routes(probs, 0.85, features, regions).tolist() == [0, -1, -1]


def test_regions_need_every_site():
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        fit_site_regions({"a": np.ones((2, 2))}, {"a": np.ones((1, 2))}, SITES)
