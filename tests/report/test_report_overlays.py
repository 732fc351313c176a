"""A site's test images with contours: which images, where they go, and what the titles say."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedsm_core.data.arrays import SegArrays
from fedsm_core.report.overlays import (
    DEPLOYMENT_FOLDER,
    OVERLAY_IMAGES,
    choose_images,
    draw_overlays,
    model_predictor,
    overlay_folder,
    write_site_overlays,
)


def _data(foreground: list[bool]) -> SegArrays:
    """8x8 RGB images; a 4x4 square of foreground in those marked True."""
    n = len(foreground)
    masks = np.zeros((n, 1, 8, 8), dtype=np.float32)
    for index, has in enumerate(foreground):
        if has:
            masks[index, 0, 2:6, 2:6] = 1.0
    images = np.full((n, 3, 8, 8), 0.5, dtype=np.float32)
    return SegArrays(images, masks, tuple(f"s/{i:04d}" for i in range(n)))


def test_images_with_foreground_come_first_then_empty_ones():
    data = _data([False, True, False, True])

    assert choose_images(data, 3) == [1, 3, 0]
    assert choose_images(data, 10) == [1, 3, 0, 2]
    assert choose_images(_data([]), 3) == []


def test_a_simulated_node_writes_into_the_run_folder_a_deployed_one_on_its_own_machine(tmp_path):
    sent = str(tmp_path / "run" / "overlays")

    assert overlay_folder({"partition-id": 2, "num-partitions": 6}, sent, 7) == (Path(sent), True)
    # deployment: the server's folder is never used, images stay on the site
    assert overlay_folder({"site-name": "site-3"}, sent, 7) == (Path(DEPLOYMENT_FOLDER) / "run-7", False)
    assert overlay_folder({"site-name": "site-3", "overlay-dir": str(tmp_path / "mine")}, sent, 7) == \
        (tmp_path / "mine" / "run-7", False)
    assert overlay_folder({"partition-id": 2}, "", 7) == (None, False)  # the server asked for none


class _Perfect(torch.nn.Module):
    """Predicts the ground truth of the test images (logits +-10)."""

    def __init__(self, masks: np.ndarray) -> None:
        super().__init__()
        self.masks = torch.from_numpy(masks)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.masks[: len(images)] * 20.0 - 10.0


def test_overlay_png_of_a_site_is_written_with_the_routed_model_and_dice_in_the_titles(tmp_path, monkeypatch):
    # Prepare: a model that is right on the chosen images (the two with foreground come first)
    data = _data([False, True, True, True, True])
    chosen = choose_images(data)
    titles: list[list[str]] = []
    monkeypatch.setattr("fedsm_core.report.overlays.draw_overlays",
                        lambda images, truth, predicted, t, path: titles.append(list(t)) or draw_overlays(
                            images, truth, predicted, t, path))

    # Execute
    path = write_site_overlays(model_predictor(_Perfect(data.masks[chosen]), "global"), data, "site-2", tmp_path)

    # Assert
    assert path == tmp_path / "site-2.png" and path.stat().st_size > 1000
    assert len(titles[0]) == OVERLAY_IMAGES
    assert titles[0][0] == "s/0001\nrouted to global, Dice 1.000"


def test_no_png_for_a_site_without_test_images(tmp_path):
    assert write_site_overlays(model_predictor(torch.nn.Identity()), _data([]), "site-1", tmp_path) is None
    assert not list(tmp_path.iterdir())


def test_grey_images_and_full_or_empty_masks_draw_without_contour_errors(tmp_path):
    images = np.zeros((2, 1, 8, 8), dtype=np.float32)
    full, empty = np.ones((2, 1, 8, 8), dtype=np.float32), np.zeros((2, 1, 8, 8), dtype=np.float32)

    path = draw_overlays(images, full, empty, ["a", "b"], tmp_path / "x.png")

    assert path.is_file()


def test_super_model_predictor_names_the_routed_site():
    from fedsm_core.algorithms.fedsm.super_model import GLOBAL_ROUTE
    from fedsm_core.report.overlays import super_model_predictor

    class _Routed:
        def forward_with_routes(self, images):
            return torch.zeros(3, 1, 4, 4), torch.tensor([1, GLOBAL_ROUTE, 0]), None

    _, names = super_model_predictor(_Routed(), ("site-1", "site-2"))(torch.zeros(3, 3, 4, 4))

    assert names == ["site-2", "global", "site-1"]
