"""The routing matrix's cells a site reports with its test evaluation."""

from __future__ import annotations

import pytest
import torch

from fedsm_core.algorithms.fedsm.super_model import GLOBAL_ROUTE
from fedsm_core.evaluation.super_model_evaluation import routing_cells
from fedsm_core.run_files.run_outputs import pool_site_metrics


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


def test_the_test_evaluation_routing_row_restates_dice_super_and_share_global():
    # Prepare: the toy super model of test_evaluation (selector = first pixels, models = thresholds)
    from support.tiny_super_model import ChannelSelector, Threshold, tiny_site

    from fedsm_core.algorithms.fedsm.super_model import SuperModel
    from fedsm_core.evaluation.super_model_evaluation import evaluate_super_model

    model = SuperModel(Threshold(0.55), [Threshold(0.5), Threshold(0.7), Threshold(0.2)], ChannelSelector(3), 0.5)

    # Execute
    metrics = evaluate_super_model(model, 0, tiny_site(0), batch_size=5, routing=True)

    # Assert: the row's counts cover every image, its share to global is share-global, and the
    # count-weighted Dice of its cells is dice-super (every toy image has foreground)
    counts = {key: value for key, value in metrics.items() if key.startswith("num-routed-")}
    assert sum(counts.values()) == metrics["num-images"] == 12
    assert counts.get("num-routed-global", 0.0) / 12 == pytest.approx(metrics["share-global"])
    weighted = sum(metrics[f"routed-dice-{key.removeprefix('num-routed-')}"] * n for key, n in counts.items()) / 12
    assert weighted == pytest.approx(metrics["dice-super"])
    assert "num-routed-global" not in evaluate_super_model(model, 0, tiny_site(0), batch_size=5)  # only when asked
