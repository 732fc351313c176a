"""Finding, pairing and reading image/mask files: pairs by stem, errors that name files."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image

from fedsm_core.data.files import DataError, list_images, pair_by_stem, read_image, read_mask_values


def _touch(folder, *names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


@pytest.fixture
def shifted(tmp_path):
    """Images a, b, c and masks b, c, d: sorted position would pair a with b."""
    images = _touch(tmp_path / "image", "a.png", "b.png", "c.png")
    masks = _touch(tmp_path / "mask", "b.png", "c.png", "d.png")
    return images, masks


def test_orphans_fail_with_each_orphan_named_and_what_it_lacks(shifted):
    images, masks = shifted

    with pytest.raises(DataError) as caught:
        pair_by_stem(images, masks)

    message = str(caught.value)
    assert f"image without mask: {images / 'a.png'}" in message
    assert f"mask without image: {masks / 'd.png'}" in message
    assert "2 file(s)" in message
    assert "on-orphans" in message
    assert "b.png" not in message and "c.png" not in message


def test_skipped_orphans_are_listed_in_a_warning_and_pairs_match_by_stem(shifted):
    images, masks = shifted

    with pytest.warns(UserWarning) as caught:
        pairing = pair_by_stem(images, masks, on_orphans="skip")

    message = str(caught[0].message)
    assert str(images / "a.png") in message and str(masks / "d.png") in message
    assert [(p.stem, p.image, p.mask) for p in pairing.pairs] == [
        ("b", images / "b.png", masks / "b.png"),
        ("c", images / "c.png", masks / "c.png"),
    ]
    assert pairing.images_without_mask == (images / "a.png",)
    assert pairing.masks_without_image == (masks / "d.png",)
    assert pairing.orphans == (images / "a.png", masks / "d.png")


def test_complete_folders_pair_without_warning_across_extensions(tmp_path):
    images = _touch(tmp_path / "image", "b.jpg", "a.png")
    masks = _touch(tmp_path / "mask", "a.png", "b.png")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pairing = pair_by_stem(images, masks)

    assert [(p.stem, p.image.name, p.mask.name) for p in pairing.pairs] == [("a", "a.png", "a.png"),
                                                                           ("b", "b.jpg", "b.png")]
    assert pairing.orphans == ()


def test_mask_suffix_is_removed_before_matching(tmp_path):
    images = _touch(tmp_path / "image", "case1.png", "case2.png")
    masks = _touch(tmp_path / "mask", "case1_mask.png", "case2_mask.png")

    pairing = pair_by_stem(images, masks, mask_suffix="_mask")

    assert [(p.stem, p.mask.name) for p in pairing.pairs] == [("case1", "case1_mask.png"),
                                                               ("case2", "case2_mask.png")]


def test_without_the_mask_suffix_the_suffixed_masks_are_orphans(tmp_path):
    images = _touch(tmp_path / "image", "case1.png")
    masks = _touch(tmp_path / "mask", "case1_mask.png")

    with pytest.raises(DataError, match="case1_mask.png"):
        pair_by_stem(images, masks)


def test_two_files_with_one_stem_are_an_error_naming_both(tmp_path):
    folder = _touch(tmp_path / "image", "a.png", "a.jpg")

    with pytest.raises(DataError) as caught:
        list_images(folder)

    assert str(folder / "a.png") in str(caught.value) and str(folder / "a.jpg") in str(caught.value)
    assert "'a'" in str(caught.value)


def test_hidden_and_non_image_files_are_ignored(tmp_path):
    folder = _touch(tmp_path / "image", "a.PNG", ".b.png", "notes.txt", "c.tif")
    (folder / "d.png").mkdir()  # a folder that looks like an image

    assert list_images(folder) == {"a": folder / "a.PNG", "c": folder / "c.tif"}


def test_missing_folder_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "image"
    _touch(tmp_path / "mask", "a.png")

    with pytest.raises(DataError, match=str(missing)):
        pair_by_stem(missing, tmp_path / "mask")


def test_unknown_orphan_policy_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="on_orphans"):
        pair_by_stem(tmp_path, tmp_path, on_orphans="ignore")


def test_corrupt_image_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "broken.png"
    path.write_bytes(b"this is not a png at all" * 10)

    with pytest.raises(DataError, match="broken.png"):
        read_image(path)


def test_truncated_png_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "cut.png"
    noise = np.random.default_rng(0).integers(0, 256, (32, 32), dtype=np.uint8)  # incompressible
    Image.fromarray(noise).save(path)
    path.write_bytes(path.read_bytes()[:300])

    with pytest.raises(DataError, match="cut.png"):
        read_image(path)


def test_sixteen_bit_png_is_scaled_to_eight_bits(tmp_path):
    path = tmp_path / "deep.png"
    Image.fromarray(np.array([[0, 32768, 65535]], dtype=np.uint16)).save(path)

    grey = read_image(path, mode="L")

    # 32768 * 255 / 65535 = 127.5019 -> 128
    assert grey.dtype == np.uint8
    assert grey.tolist() == [[0, 128, 255]]


def test_grey_file_read_as_rgb_repeats_the_grey_value(tmp_path):
    path = tmp_path / "grey.png"
    Image.fromarray(np.array([[0, 7], [200, 255]], dtype=np.uint8)).save(path)

    rgb = read_image(path, mode="RGB")

    assert rgb.shape == (2, 2, 3)
    for channel in range(3):
        assert rgb[..., channel].tolist() == [[0, 7], [200, 255]]


def test_mask_with_colour_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "colour.png"
    rgb = np.zeros((2, 2, 3), np.uint8)
    rgb[0, 0] = (255, 0, 0)
    Image.fromarray(rgb).save(path)

    with pytest.raises(DataError, match="colour.png.*colour"):
        read_mask_values(path)


def test_grey_rgb_mask_gives_its_grey_values(tmp_path):
    path = tmp_path / "grey_rgb.png"
    grey = np.array([[0, 128], [255, 128]], dtype=np.uint8)
    Image.fromarray(np.stack([grey] * 3, axis=-1)).save(path)

    values = read_mask_values(path)

    assert values.dtype == np.uint8
    assert values.tolist() == [[0, 128], [255, 128]]


def test_sixteen_bit_mask_keeps_its_label_values(tmp_path):
    # Label values must never be rescaled: 0/1/2 scaled by the peak would read as 0/128/255,
    # which the DoFE encoding would accept as cup/rim/background without a sound.
    path = tmp_path / "labels16.png"
    Image.fromarray(np.array([[0, 1, 2]], dtype=np.uint16)).save(path)

    assert read_mask_values(path).tolist() == [[0, 1, 2]]


def test_sixteen_bit_mask_with_values_above_255_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "big16.png"
    Image.fromarray(np.array([[0, 1000]], dtype=np.uint16)).save(path)

    with pytest.raises(DataError, match="big16.png"):
        read_mask_values(path)
