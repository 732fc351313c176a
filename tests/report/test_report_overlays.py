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


class _Tagged(torch.nn.Module):
    """Logits filled with a tag, so the test sees which model segmented an image."""

    def __init__(self, tag: float) -> None:
        super().__init__()
        self.tag = tag

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.full((len(images), 1, *images.shape[-2:]), self.tag)


class _Brightness(torch.nn.Module):
    """A selector for two sites: dark images -> site-1, bright -> site-2, confidently."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        brightness = images.mean(dim=(1, 2, 3)) - 0.5
        return torch.stack([-20.0 * brightness, 20.0 * brightness], dim=1)


def _case_data(brightness: list[float], ids: list[str], areas: list[int]) -> SegArrays:
    """8x8 RGB slices of the given brightness, each with a foreground square of ``areas`` pixels per side."""
    images = np.stack([np.full((3, 8, 8), b, dtype=np.float32) for b in brightness])
    masks = np.zeros((len(ids), 1, 8, 8), dtype=np.float32)
    for index, side in enumerate(areas):
        masks[index, 0, :side, :side] = 1.0
    return SegArrays(images, masks, tuple(ids))


def _super_model():
    from fedsm_core.algorithms.fedsm.super_model import SuperModel

    return SuperModel(_Tagged(-1.0), [_Tagged(1.0), _Tagged(2.0)], _Brightness(), 0.5)


def test_super_model_predictor_names_the_routed_site_and_segments_with_its_model():
    from fedsm_core.report.overlays import super_model_predictor

    data = _case_data([0.1, 0.9, 0.5], ["s/0000", "s/0001", "s/0002"], [2, 2, 2])

    logits, names = super_model_predictor(_super_model(), ("site-1", "site-2"))(data, [1, 0, 2], "cpu")

    # brightness 0.5: both sites at probability 0.5 <= gamma, so the global model
    assert names == ["site-2", "site-1", "global"]
    assert logits[:, 0, 0, 0].tolist() == [2.0, 1.0, -1.0]


def test_with_route_by_case_every_drawn_slice_takes_its_cases_route():
    from fedsm_core.report.overlays import super_model_predictor

    # case a: two dark slices and one slightly bright one, so its mean log-probability still says site-1
    data = _case_data([0.1, 0.1, 0.6], ["s/a/z000", "s/a/z001", "s/a/z002"], [2, 3, 4])

    per_image = super_model_predictor(_super_model(), ("site-1", "site-2"))(data, [2], "cpu")[1]
    per_case = super_model_predictor(_super_model(), ("site-1", "site-2"), route_by="case")(data, [2], "cpu")[1]

    assert per_image == ["site-2"]
    assert per_case == ["site-1 (whole case)"]


def test_slices_of_volumes_show_one_patient_each_at_the_widest_section_first():
    # cases a (3 slices) and b (2 slices, one empty): the widest slice of a, then of b, then the rest
    ids = ["s/a/z000", "s/a/z001", "s/a/z002", "s/b/z000", "s/b/z001"]
    data = _case_data([0.5] * 5, ids, [2, 5, 3, 0, 4])

    assert choose_images(data, 3) == [1, 4, 0]
    assert choose_images(data, 10) == [1, 4, 0, 2, 3]
