"""The routing matrix's cells a site reports with its test evaluation."""

from __future__ import annotations

import pytest
import torch

from fedsm_core.algorithms.super_model import GLOBAL_ROUTE
from fedsm_core.evaluation import routing_cells
from fedsm_core.reporting import pool_site_metrics


def test_counts_per_route_and_dice_over_routed_images_with_foreground():
    # Prepare: 5 images; routes global, 0, 0, 2, 2; the last image has no foreground
    routes = torch.tensor([GLOBAL_ROUTE, 0, 0, 2, 2])
    dice = torch.tensor([0.4, 0.9, 0.7, 0.6, 1.0], dtype=torch.float64)
    foreground = torch.tensor([True, True, True, True, False])

    # Execute
    cells = routing_cells(routes, dice, foreground)

    # Assert: model 2's Dice is over its one image with foreground, not (0.6 + 1.0) / 2
    assert cells == pytest.approx({"num-routed-global": 1.0, "routed-dice-global": 0.4,
                                   "num-routed-0": 2.0, "routed-dice-0": 0.8,
                                   "num-routed-2": 2.0, "routed-dice-2": 0.6})


def test_a_route_taken_only_by_empty_images_has_a_count_and_no_dice():
    cells = routing_cells(torch.tensor([1]), torch.tensor([1.0]), torch.tensor([False]))

    assert cells == {"num-routed-1": 1.0}


def test_routed_counts_add_up_when_sites_are_pooled():
    per_site = {"a": {"num-images": 3.0, "num-routed-0": 2.0, "num-routed-global": 1.0},
                "b": {"num-images": 2.0, "num-routed-0": 2.0}}

    pooled = pool_site_metrics(per_site)

    assert pooled["num-routed-0"] == 4.0 and pooled["num-routed-global"] == 1.0
