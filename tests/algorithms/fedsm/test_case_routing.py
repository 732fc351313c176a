"""Routing per case (``route-by = "case"``): one decision from the mean log-probability of a case's slices."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedsm_core.algorithms.fedsm.needed_models import needed_models, routing_probabilities
from fedsm_core.algorithms.fedsm.super_model import (
    GLOBAL_ROUTE,
    case_probabilities,
    route,
    route_cases,
    selector_probabilities,
)
from fedsm_core.config import RunConfig
from fedsm_core.data.arrays import SegArrays

G = GLOBAL_ROUTE
# Two cases of three slices and one image without a case; selector probabilities of K = 2 sites.
PROBS = np.array([[0.9, 0.1], [0.3, 0.7], [0.4, 0.6],      # case A
                  [0.55, 0.45], [0.58, 0.42], [0.9, 0.1],  # case B
                  [0.2, 0.8]], dtype=np.float64)           # an image that is its own case
CASES = ["s/A", "s/A", "s/A", "s/B", "s/B", "s/B", None]
GAMMA = 0.6


def test_a_case_is_routed_once_from_the_geometric_mean_of_its_slices():
    # Prepare: log-probabilities, float64
    log_probs = torch.from_numpy(np.log(PROBS))

    # Execute
    pooled = case_probabilities(log_probs, CASES)
    per_case = route_cases(log_probs, CASES, GAMMA)
    per_image = route(torch.from_numpy(PROBS), GAMMA)

    # Assert: case A: geometric means (0.9 * 0.3 * 0.4)^(1/3) = 0.108^(1/3) = 0.476220 and
    # (0.1 * 0.7 * 0.6)^(1/3) = 0.042^(1/3) = 0.347603, softmax of the mean logs = 0.476220 / 0.823823
    # = 0.578061 <= 0.6: all three slices to the global model, where alone they go to 0, 1 and global.
    # Case B: 0.2871^(1/3) = 0.659697 and 0.0189^(1/3) = 0.266371 -> 0.659697 / 0.926068 = 0.712363 > 0.6:
    # all three to site 0, where alone two go to the global model (0.55, 0.58 <= 0.6).
    # The image without a case keeps its own 0.8 > 0.6 -> site 1 either way.
    assert pooled.dtype == torch.float64
    np.testing.assert_allclose(pooled[:3, 0].numpy(), 0.578061, atol=1e-6)
    np.testing.assert_allclose(pooled[3:6, 0].numpy(), 0.712363, atol=1e-6)
    np.testing.assert_allclose(pooled[6].numpy(), [0.2, 0.8], atol=1e-12)
    assert per_image.tolist() == [0, 1, G, G, G, 0, 1]
    assert per_case.tolist() == [G, G, G, 0, 0, 0, 1]


def test_per_case_routing_without_cases_is_per_image_routing():
    log_probs = torch.from_numpy(np.log(PROBS))
    alone = route_cases(log_probs, [None] * len(PROBS), GAMMA)
    assert alone.tolist() == route(torch.from_numpy(PROBS), GAMMA).tolist()


def test_a_case_of_one_slice_keeps_its_probabilities():
    logits = torch.tensor([[2.0, -1.0, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(selector_probabilities(logits, ["s/A"], "case"), torch.softmax(logits, dim=1))


def test_route_by_image_is_the_softmax_whatever_the_cases():
    logits = torch.from_numpy(np.log(PROBS))
    torch.testing.assert_close(selector_probabilities(logits, CASES, "image"), torch.from_numpy(PROBS))


def test_an_unknown_route_by_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"route-by = 'volume' is not one of \['image', 'case'\]"):
        selector_probabilities(torch.zeros(1, 2), ["s/A"], "volume")


def test_a_bad_shape_or_case_count_is_refused_with_both_sizes():
    with pytest.raises(ValueError, match=r"shape \(3, 2\) and 2 cases"):
        case_probabilities(torch.zeros(3, 2), ["s/A", "s/A"])


def test_route_by_is_a_run_config_key_of_the_fedsm_settings():
    assert RunConfig.from_mapping({}).fedsm_settings.route_by == "image"
    assert RunConfig.from_mapping({"route-by": "case"}).fedsm_settings.route_by == "case"
    with pytest.raises(ValueError, match="route-by"):
        RunConfig.from_mapping({"route-by": "volume"})


class TableSelector(nn.Module):
    """Logits = the first K pixels of channel 0 of each image (the test writes log-probabilities there)."""

    def __init__(self, num_sites: int) -> None:
        super().__init__()
        self.num_sites = num_sites

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images[:, 0, 0, : self.num_sites]


def _split(log_probs: np.ndarray, ids: list[str]) -> SegArrays:
    images = np.zeros((len(ids), 3, 8, 8), dtype=np.float32)
    images[:, 0, 0, : log_probs.shape[1]] = log_probs
    return SegArrays(images, np.zeros((len(ids), 1, 8, 8), dtype=np.float32), tuple(ids))


def test_a_case_may_need_a_model_that_is_no_slices_argmax():
    # Prepare: K = 3; slice argmaxes 0 and 2, but the geometric means are sqrt(0.6 * 0.01) = 0.0775 (sites 0
    # and 2) and 0.39 (site 1): the case goes to model 1 when 0.39 / (0.39 + 2 * 0.0775) = 0.7157 > gamma.
    probs = np.array([[0.6, 0.39, 0.01], [0.01, 0.39, 0.6]])
    data = _split(np.log(probs), ["s/A/z000", "s/A/z001"])

    # Execute
    per_image = needed_models(TableSelector(3), data, None, False, batch_size=1)
    per_case = needed_models(TableSelector(3), data, None, False, batch_size=1, route_by="case")
    pooled = routing_probabilities(TableSelector(3), data, batch_size=1, route_by="case")

    # Assert
    assert per_image == [0, 2]
    assert per_case == [1]
    np.testing.assert_allclose(pooled[:, 1].numpy(), 0.39 / (0.39 + 2 * np.sqrt(0.006)), atol=1e-5)
