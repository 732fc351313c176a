"""Masks at the input's resolution, with the aspect ratio kept (letterboxing in ``fedsm predict``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedsm_core.inference.letterbox import (
    Letterbox,
    letterbox_for,
    letterbox_image,
    model_input,
    restore_probabilities,
    stretch_for,
)
from fedsm_core.inference.predict import Predictor, segment_batch


def round_blob(inputs: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, str]]]:
    """A stand-in segmenter with a shape prior, as a trained U-Net has: it draws a disc.

    The disc has the bright region's intensity-weighted centroid and area
    (``r = sqrt(mass / pi)``) in the model's input; logits ``4 (r - distance)``
    put the 0.5 contour exactly on the circle. A squashed input yields a disc
    that is no longer round once unsquashed, so the test below can tell.
    """
    x = inputs[:, 0].double()
    size = x.shape[-1]
    ys, xs = torch.meshgrid(torch.arange(size, dtype=torch.float64), torch.arange(size, dtype=torch.float64),
                            indexing="ij")
    mass = x.sum((1, 2))
    cy, cx = (x * ys).sum((1, 2)) / mass, (x * xs).sum((1, 2)) / mass
    radius = torch.sqrt(mass / torch.pi)
    distance = torch.sqrt((ys - cy[:, None, None]) ** 2 + (xs - cx[:, None, None]) ** 2)
    logits = 4.0 * (radius[:, None, None] - distance)
    return logits[:, None].float(), [{"model": "global", "selector-confidence": "", "most-likely-site": ""}] * len(x)


PREDICTOR = Predictor(round_blob, 64, "unit")


def disc_image(height: int, width: int, cy: float, cx: float, radius: float) -> np.ndarray:
    ys, xs = np.mgrid[:height, :width]
    disc = (ys + 0.5 - cy) ** 2 + (xs + 0.5 - cx) ** 2 <= radius ** 2
    return np.repeat((disc * 255).astype(np.uint8)[..., None], 3, axis=2)


def dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * np.logical_and(a, b).sum() / (a.sum() + b.sum())


def segment(image: np.ndarray) -> np.ndarray:
    [row] = segment_batch(PREDICTOR, [(Path("x.png"), image)], torch.device("cpu"))
    assert row["mask"].shape == image.shape[:2]
    return row["mask"] > 0


def test_letterbox_of_a_wide_image_fits_its_long_side_and_centres_the_short_one():
    # 256 x 768 into 64: scale 1/12, 256 / 12 = 21.33 -> 21 rows, (64 - 21) // 2 = 21 rows above
    box = letterbox_for(256, 768, 64)

    assert (box.inner_height, box.inner_width, box.top, box.left) == (21, 64, 21, 0)
    # 70 x 50 into 32: 50 * 32 / 70 = 22.86 -> 23 columns, (32 - 23) // 2 = 4 columns to the left
    tall = letterbox_for(70, 50, 32)
    assert (tall.inner_height, tall.inner_width, tall.top, tall.left) == (32, 23, 0, 4)


def test_letterbox_image_pads_with_zero_after_normalizing():
    image = np.full((10, 20), 100.0, dtype=np.float32)
    box = letterbox_for(10, 20, 8)   # 4 x 8, 2 rows of padding above and below

    square = letterbox_image(image, box, lambda a: a / 100.0)

    np.testing.assert_allclose(square[2:6], 1.0)
    assert np.all(square[:2] == 0) and np.all(square[6:] == 0)


def test_restore_probabilities_crops_the_padding_and_keeps_a_constant_map_constant():
    box = letterbox_for(10, 20, 8)
    probs = torch.zeros(1, 8, 8)
    probs[:, 2:6] = 0.75   # only the image's rows carry 0.75; the padding is 0

    restored = restore_probabilities(probs, box)

    assert restored.shape == (1, 10, 20)
    torch.testing.assert_close(restored, torch.full((1, 10, 20), 0.75))


def test_a_mismatched_image_or_probability_map_is_refused():
    box = letterbox_for(10, 20, 8)
    with pytest.raises(ValueError, match=r"\(12, 20\) does not fit its letterbox \(10, 20\)"):
        letterbox_image(np.zeros((12, 20)), box, lambda a: a)
    with pytest.raises(ValueError, match="do not match the model size 8"):
        restore_probabilities(torch.zeros(1, 4, 4), box)


def test_a_256_px_input_to_a_64_px_model_gets_edges_finer_than_4_pixel_blocks():
    # Prepare: a disc of radius 70 px; the model sees it at a quarter of the resolution
    image = disc_image(256, 256, 128.0, 128.0, 70.0)

    # Execute
    mask = segment(image)

    # Assert: some aligned 4 x 4 block holds both values (an enlarged 64 px label map never does)
    blocks = mask.reshape(64, 4, 64, 4).transpose(0, 2, 1, 3).reshape(64, 64, 16)
    mixed = blocks.any(axis=2) & ~blocks.all(axis=2)
    assert mixed.sum() > 20
    assert dice(mask, image[..., 0] > 0) > 0.98


def test_a_wide_image_gives_on_its_central_square_the_mask_of_that_square():
    # Prepare: a 256 x 768 image whose only disc lies in its central 256 x 256 square
    wide = disc_image(256, 768, 128.0, 384.0, 80.0)
    square = np.ascontiguousarray(wide[:, 256:512])

    # Execute
    wide_mask = segment(wide)
    square_mask = segment(square)

    # Assert: squashing the wide image to a square would give a disc three times wider than tall
    assert dice(wide_mask[:, 256:512], square_mask) > 0.95
    assert not wide_mask[:, :256].any() and not wide_mask[:, 512:].any()


def test_stretch_fills_the_square_and_restores_to_the_slices_own_size():
    # A 6 x 4 slice stretched to 8 x 8 (training's placement of a NIfTI slice): no padding
    box = stretch_for(6, 4, 8)
    probabilities = torch.zeros(1, 8, 8)
    probabilities[0, :4] = 1.0  # the top half of the square

    restored = restore_probabilities(probabilities, box)

    assert box == Letterbox(6, 4, 8, 0, 0, 8, 8)
    assert restored.shape == (1, 6, 4)
    # rows 0..2 lie in the top half (the middle edge falls exactly between rows 2 and 3)
    np.testing.assert_array_equal((restored[0] > 0.5).numpy(), np.repeat([[1], [1], [1], [0], [0], [0]], 4, axis=1))
    square = model_input(np.full((6, 4), 51.0), box, "unit")
    assert square.shape == (3, 8, 8) and np.allclose(square, 0.2)  # 51 / 255, no zero padding anywhere


def test_stretch_and_model_input_refuse_bad_arguments():
    with pytest.raises(ValueError, match="slice 4 x 0 or model size 8 is empty"):
        stretch_for(0, 4, 8)
    with pytest.raises(ValueError, match="preprocessing 'zscore' is unknown; expected one of"):
        model_input(np.zeros((4, 4)), stretch_for(4, 4, 8), "zscore")
