"""Mask encodings: label values in a file -> binary targets, and loud errors for anything else."""

from __future__ import annotations

import numpy as np
import pytest

from fedsm_core.data.files import DataError
from fedsm_core.data.masks import ENCODINGS, decode_mask, mask_encoding, unexpected_values


def _decode(values, name):
    return decode_mask(np.array(values, dtype=np.uint8), mask_encoding(name), "site/mask/x.png")


def test_dofe_fundus_disc_is_rim_plus_cup_and_cup_is_zero():
    values = [[0, 128, 255],
              [128, 0, 255],
              [255, 255, 128]]

    targets = _decode(values, "dofe-fundus")

    assert targets.dtype == bool and targets.shape == (2, 3, 3)
    assert mask_encoding("dofe-fundus").structures == ("disc", "cup")
    assert targets[0].astype(int).tolist() == [[1, 1, 0],
                                               [1, 1, 0],
                                               [0, 0, 1]]
    assert targets[1].astype(int).tolist() == [[1, 0, 0],
                                               [0, 1, 0],
                                               [0, 0, 0]]


def test_inverted_binary_marks_zero_as_structure():
    targets = _decode([[0, 255], [255, 0]], "inverted-binary")

    assert targets.shape == (1, 2, 2)
    assert targets[0].astype(int).tolist() == [[1, 0], [0, 1]]


def test_binary_marks_255_as_structure():
    targets = _decode([[0, 255], [255, 0]], "binary")

    assert targets.shape == (1, 2, 2)
    assert targets[0].astype(int).tolist() == [[0, 1], [1, 0]]


def test_label_map_merges_zones_one_and_two():
    targets = _decode([[0, 1], [2, 0]], "label-map")

    assert targets.shape == (1, 2, 2)
    assert targets[0].astype(int).tolist() == [[0, 1], [1, 0]]


def test_every_encoding_has_one_target_plane_per_structure():
    values = np.zeros((4, 5), np.uint8)
    for encoding in ENCODINGS.values():
        assert encoding.decode(values).shape == (len(encoding.structures), 4, 5)


def test_resized_mask_value_is_an_error_naming_file_values_and_allowed_values():
    values = np.array([[0, 127], [255, 128]], dtype=np.uint8)  # 127: interpolation at a boundary

    with pytest.raises(DataError) as caught:
        decode_mask(values, mask_encoding("dofe-fundus"), "siteA/train/ROIs/mask/n01.png")

    message = str(caught.value)
    assert "siteA/train/ROIs/mask/n01.png" in message
    assert "[127]" in message
    assert "[0, 128, 255]" in message
    assert "'dofe-fundus'" in message


def test_values_of_another_encoding_are_rejected():
    # A 0/1 label map read as an inverted-binary prostate mask: 1 is not allowed.
    with pytest.raises(DataError, match=r"\[1\].*allowed \[0, 255\]"):
        _decode([[0, 1], [1, 0]], "inverted-binary")


def test_long_lists_of_unexpected_values_are_cut_after_ten():
    values = np.arange(20, dtype=np.uint8).reshape(4, 5)

    with pytest.raises(DataError) as caught:
        decode_mask(values, mask_encoding("binary"), "m.png")

    assert "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, '...']" in str(caught.value)


def test_unexpected_values_lists_only_disallowed_values_sorted():
    values = np.array([255, 7, 0, 3, 7], dtype=np.uint8)

    assert unexpected_values(values, mask_encoding("binary")) == [3, 7]
    assert unexpected_values(np.array([0, 255], np.uint8), mask_encoding("binary")) == []


def test_unknown_encoding_name_lists_the_known_ones():
    with pytest.raises(ValueError) as caught:
        mask_encoding("rgb-palette")

    message = str(caught.value)
    assert "'rgb-palette'" in message
    for name in ("dofe-fundus", "inverted-binary", "binary", "label-map"):
        assert f"'{name}'" in message
