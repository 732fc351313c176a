"""Loading sites of the public PNG layouts (DoFE fundus, ProstateSlice) from tiny generated files."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from support.png_sites import (
    FILE_SIZE,
    box_target,
    fundus_folders,
    fundus_mask,
    prostate_folders,
    save,
    write_fundus_site,
    write_prostate_site,
)

from fedsm_core.data.files import DataError
from fedsm_core.data.png_layouts import VAL_FRACTION, load_png_site, png_layout
from fedsm_core.data.preprocess import split_off

SIZE = 8  # files are 16x16: loading halves them
TRAIN = ("a", "b", "c", "d", "e")
TEST = ("t1", "t2")


def _stem(example_id: str) -> str:
    return example_id.split("/", 1)[1]


def _check_fundus_split(arrays, site):
    for image, mask, example_id in zip(arrays.images, arrays.masks, arrays.ids, strict=True):
        assert example_id.startswith(f"{site}/")
        stem = _stem(example_id)
        assert np.array_equal(mask[0], box_target(stem, SIZE)), f"disc of {example_id}"
        assert np.array_equal(mask[1], box_target(stem, SIZE, inner=True)), f"cup of {example_id}"
        # the image of the same stem: bright exactly on the disc
        assert np.array_equal(image[0], box_target(stem, SIZE)), f"image of {example_id}"
        assert np.array_equal(image[1], np.zeros((SIZE, SIZE))), f"image of {example_id}"


@pytest.mark.parametrize("rgb_masks", [False, True], ids=["grey-masks", "grey-rgb-masks"])
def test_fundus_site_gives_disc_and_cup_targets_at_the_drawn_places(tmp_path, rgb_masks):
    site = write_fundus_site(tmp_path / "siteA", TRAIN, TEST, rgb_masks=rgb_masks)

    splits = load_png_site(site, "fundus-dofe", SIZE, seed=0)

    assert splits.name == "siteA"
    for arrays, count in ((splits.train, 4), (splits.val, 1), (splits.test, 2)):
        assert arrays.images.shape == (count, 3, SIZE, SIZE) and arrays.images.dtype == np.float32
        assert arrays.masks.shape == (count, 2, SIZE, SIZE) and arrays.masks.dtype == np.float32
        _check_fundus_split(arrays, "siteA")


def test_disc_of_a_known_example_after_nearest_resizing(tmp_path):
    # stem "b": disc at rows/cols 4..11 of the 16x16 file, cup at 6..9 -> 2..5 and 3..4 at 8x8
    site = write_fundus_site(tmp_path / "siteA", train=("b",), test=("b",))

    mask = load_png_site(site, "fundus-dofe", SIZE).test.masks[0]

    disc = np.zeros((SIZE, SIZE))
    disc[2:6, 2:6] = 1
    cup = np.zeros((SIZE, SIZE))
    cup[3:5, 3:5] = 1
    assert np.array_equal(mask[0], disc)
    assert np.array_equal(mask[1], cup)


def test_train_folder_is_split_into_train_and_validation_by_seed_and_site_name(tmp_path):
    site = write_fundus_site(tmp_path / "siteA", TRAIN, TEST)

    splits = load_png_site(site, "fundus-dofe", SIZE, seed=4)

    kept, taken = split_off(list(TRAIN), VAL_FRACTION, 4, "siteA")
    assert [_stem(i) for i in splits.train.ids] == kept
    assert [_stem(i) for i in splits.val.ids] == taken
    assert len(taken) == round(VAL_FRACTION * len(TRAIN)) == 1
    assert sorted(kept + taken) == list(TRAIN)
    assert splits.test.ids == ("siteA/t1", "siteA/t2")


def test_site_name_sets_the_ids_and_the_split_salt(tmp_path):
    site = write_fundus_site(tmp_path / "folder", TRAIN, TEST)

    splits = load_png_site(site, "fundus-dofe", SIZE, seed=0, name="Drishti")

    assert splits.name == "Drishti"
    assert splits.test.ids == ("Drishti/t1", "Drishti/t2")
    assert [_stem(i) for i in splits.val.ids] == split_off(list(TRAIN), VAL_FRACTION, 0, "Drishti")[1]


def test_prostate_site_gives_one_inverted_target_and_grey_in_three_channels(tmp_path):
    site = write_prostate_site(tmp_path / "BIDMC", TRAIN, TEST)

    splits = load_png_site(site, "prostate-slices", SIZE, seed=0)

    for arrays, count in ((splits.train, 4), (splits.val, 1), (splits.test, 2)):
        assert arrays.images.shape == (count, 3, SIZE, SIZE) and arrays.images.dtype == np.float32
        assert arrays.masks.shape == (count, 1, SIZE, SIZE) and arrays.masks.dtype == np.float32
        for image, mask, example_id in zip(arrays.images, arrays.masks, arrays.ids, strict=True):
            expected = box_target(_stem(example_id), SIZE)
            assert np.array_equal(mask[0], expected), example_id  # 0 in the file = prostate
            for channel in range(3):
                assert np.array_equal(image[channel], expected), example_id


def test_another_mask_encoding_can_be_chosen(tmp_path):
    site = write_prostate_site(tmp_path / "BIDMC", TRAIN, TEST)

    splits = load_png_site(site, "prostate-slices", SIZE, encoding="binary")

    for mask, example_id in zip(splits.test.masks, splits.test.ids, strict=True):
        assert np.array_equal(mask[0], 1 - box_target(_stem(example_id), SIZE))


def test_orphans_fail_naming_the_files(tmp_path):
    site = write_fundus_site(tmp_path / "siteA", TRAIN, TEST)
    image_dir, _ = fundus_folders(site, "train")
    shutil.copy(image_dir / "a.png", image_dir / "zz.png")

    with pytest.raises(DataError, match=r"image without mask: .*zz\.png"):
        load_png_site(site, "fundus-dofe", SIZE)


def test_skipped_orphans_warn_and_the_rest_loads(tmp_path):
    site = write_prostate_site(tmp_path / "BIDMC", TRAIN, TEST)
    _, mask_dir = prostate_folders(site, "test")
    shutil.copy(mask_dir / "t1.png", mask_dir / "lonely.png")

    with pytest.warns(UserWarning, match=r"mask without image: .*lonely\.png"):
        splits = load_png_site(site, "prostate-slices", SIZE, on_orphans="skip")

    assert splits.test.ids == ("BIDMC/t1", "BIDMC/t2")
    assert len(splits.train) + len(splits.val) == len(TRAIN)


def test_corrupt_image_is_an_error_naming_it(tmp_path):
    site = write_fundus_site(tmp_path / "siteA", TRAIN, TEST)
    image_dir, _ = fundus_folders(site, "train")
    (image_dir / "c.png").write_bytes(b"\x89PNG but not really" * 5)

    with pytest.raises(DataError, match=str(image_dir / "c.png")):
        load_png_site(site, "fundus-dofe", SIZE)


def test_resized_mask_values_are_an_error_naming_the_mask(tmp_path):
    site = write_fundus_site(tmp_path / "siteA", TRAIN, TEST)
    _, mask_dir = fundus_folders(site, "test")
    mask = fundus_mask("t2")
    mask[0, 0] = 127
    save(mask_dir / "t2.png", mask)

    with pytest.raises(DataError, match=r"t2\.png contains values \[127\]"):
        load_png_site(site, "fundus-dofe", SIZE)


def test_coloured_mask_is_an_error(tmp_path):
    site = write_fundus_site(tmp_path / "siteA", TRAIN, TEST)
    _, mask_dir = fundus_folders(site, "train")
    rgb = np.stack([fundus_mask("a")] * 3, axis=-1)
    rgb[0, 0] = (255, 0, 0)
    save(mask_dir / "a.png", rgb)

    with pytest.raises(DataError, match=r"a\.png has colour"):
        load_png_site(site, "fundus-dofe", SIZE)


def test_image_and_mask_of_different_sizes_are_an_error_with_both_sizes(tmp_path):
    site = write_prostate_site(tmp_path / "BIDMC", TRAIN, TEST)
    _, mask_dir = prostate_folders(site, "train")
    save(mask_dir / "d.png", np.full((FILE_SIZE // 2, FILE_SIZE), 255, np.uint8))

    with pytest.raises(DataError) as caught:
        load_png_site(site, "prostate-slices", SIZE)

    message = str(caught.value)
    assert "d.png" in message and "16x16" in message and "16x8" in message


def test_missing_test_folder_shows_the_expected_layout(tmp_path):
    site = write_fundus_site(tmp_path / "siteA", TRAIN, TEST)
    shutil.rmtree(site / "test")

    with pytest.raises(DataError) as caught:
        load_png_site(site, "fundus-dofe", SIZE)

    message = str(caught.value)
    assert str(site / "test" / "ROIs" / "image") in message
    assert "<site>/{train,test}/ROIs/{image,mask}/<name>.png" in message


def test_prostate_layout_has_no_rois_folder(tmp_path):
    site = write_fundus_site(tmp_path / "siteA", TRAIN, TEST)  # the fundus layout, named as prostate

    with pytest.raises(DataError, match=r"<site>/\{train,test\}/\{image,mask\}/<name>\.png"):
        load_png_site(site, "prostate-slices", SIZE)


def test_site_without_training_pairs_is_an_error(tmp_path):
    site = write_prostate_site(tmp_path / "BIDMC", train=(), test=TEST)

    with pytest.raises(DataError, match="no image/mask pairs in its train folder"):
        load_png_site(site, "prostate-slices", SIZE)


def test_unknown_layout_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"\['fundus-dofe', 'prostate-slices'\]"):
        png_layout("fundus-refuge")
