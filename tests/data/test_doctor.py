"""The data doctor collects every problem of a site into its report instead of raising."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from support.png_sites import (
    fundus_folders,
    fundus_mask,
    prostate_folders,
    save,
    write_fundus_site,
    write_prostate_site,
)

from fedsm_core.data.doctor import inspect_png_site, site_folders
from fedsm_core.data.doctor_report import format_reports
from fedsm_core.data.files import DataError


@pytest.fixture
def troubled_site(tmp_path):
    """Train: a, b good; c corrupt image; d mask value 7; e empty mask; zz image without mask."""
    site = write_fundus_site(tmp_path / "siteA", train=("a", "b", "c", "d", "e"), test=("t1",))
    image_dir, mask_dir = fundus_folders(site, "train")
    shutil.copy(image_dir / "a.png", image_dir / "zz.png")
    (image_dir / "c.png").write_bytes(b"garbage bytes, no image here" * 4)
    mask = fundus_mask("d")
    mask[0, 0] = 7
    save(mask_dir / "d.png", mask)
    save(mask_dir / "e.png", np.full((16, 16), 255, np.uint8))
    return site, image_dir, mask_dir


def test_each_problem_goes_into_its_field_without_raising(troubled_site):
    site, image_dir, mask_dir = troubled_site

    report = inspect_png_site(site, "fundus-dofe")

    assert not report.ok
    assert (report.site, report.source, report.errors) == ("siteA", "fundus-dofe", [])
    train, test = report.splits
    assert (train.split, test.split) == ("train", "test")
    assert train.orphans == [f"{image_dir / 'zz.png'} (image without mask)"]
    assert len(train.errors) == 2
    assert str(image_dir / "c.png") in train.errors[0]  # pairs are checked in stem order: c before d
    assert str(mask_dir / "d.png") in train.errors[1] and "[7]" in train.errors[1]
    assert train.empty_masks == [str(mask_dir / "e.png")]
    assert train.count == 3  # a, b and the empty (but legal) e
    assert train.mask_values == {0, 7, 128, 255}
    assert train.sizes == {"16x16": 4}  # every readable pair
    assert (test.count, test.errors, test.orphans, test.empty_masks) == (1, [], [], [])


def test_formatted_report_mentions_each_problem_and_ends_with_the_verdict(troubled_site):
    site, image_dir, mask_dir = troubled_site

    text = format_reports([inspect_png_site(site, "fundus-dofe")])

    lines = text.splitlines()
    assert lines[0] == f"site siteA (fundus-dofe) at {site}: ERRORS"
    assert any(line.startswith("    orphan: ") and "zz.png (image without mask)" in line for line in lines)
    assert any(line.startswith("    error: ") and str(image_dir / "c.png") in line for line in lines)
    assert any(line.startswith("    error: ") and str(mask_dir / "d.png") in line for line in lines)
    assert f"    empty mask: {mask_dir / 'e.png'}" in lines
    assert "  train: 3 usable, sizes 16x16 x4, mask values {0, 7, 128, 255}, 1 empty masks, 1 orphans, 2 errors" \
        in lines
    assert lines[-1] == "1 site(s) checked; errors in ['siteA']"


def test_size_mismatch_is_an_error_of_its_split(tmp_path):
    site = write_prostate_site(tmp_path / "BIDMC", train=("a", "b"), test=("t1",))
    _, mask_dir = prostate_folders(site, "test")
    save(mask_dir / "t1.png", np.full((8, 8), 255, np.uint8))

    report = inspect_png_site(site, "prostate-slices")

    train, test = report.splits
    assert (train.count, train.errors) == (2, [])
    assert test.count == 0 and len(test.errors) == 1
    assert "16x16" in test.errors[0] and "8x8" in test.errors[0]
    assert not report.ok


def test_clean_site_is_ok_and_the_verdict_says_no_errors(tmp_path):
    site = write_prostate_site(tmp_path / "BIDMC", train=("a", "b", "c"), test=("t1", "t2"))

    report = inspect_png_site(site, "prostate-slices", name="Site-1")

    assert report.ok
    assert [(s.split, s.count, s.errors, s.orphans, s.empty_masks) for s in report.splits] == [
        ("train", 3, [], [], []), ("test", 2, [], [], [])]
    assert report.splits[0].mask_values == {0, 255}
    text = format_reports([report])
    assert text.splitlines()[0] == f"site Site-1 (prostate-slices) at {site}: OK"
    assert text.splitlines()[-1] == "1 site(s) checked; no errors"


def test_empty_masks_alone_are_warnings_not_errors(tmp_path):
    site = write_prostate_site(tmp_path / "BIDMC", train=("a",), test=("t1",))
    _, mask_dir = prostate_folders(site, "train")
    save(mask_dir / "a.png", np.full((16, 16), 255, np.uint8))

    report = inspect_png_site(site, "prostate-slices")

    assert report.ok
    assert report.splits[0].empty_masks == [str(mask_dir / "a.png")]


def test_missing_site_folder_and_missing_split_folder_are_reported(tmp_path):
    missing = inspect_png_site(tmp_path / "nowhere", "fundus-dofe")
    site = write_fundus_site(tmp_path / "siteA", train=("a",), test=("t1",))
    shutil.rmtree(site / "test")
    no_test = inspect_png_site(site, "fundus-dofe")

    assert not missing.ok and missing.splits == []
    assert "nowhere" in missing.errors[0] and "{train,test}/ROIs/{image,mask}" in missing.errors[0]
    assert not no_test.ok
    assert no_test.splits[0].errors == [] and no_test.splits[0].count == 1
    assert str(site / "test" / "ROIs" / "image") in no_test.splits[1].errors[0]


def test_verdict_lists_only_the_sites_with_errors(tmp_path):
    good = inspect_png_site(write_prostate_site(tmp_path / "good", train=("a",), test=("t1",)), "prostate-slices")
    bad = inspect_png_site(tmp_path / "bad", "prostate-slices")

    text = format_reports([good, bad])

    assert text.splitlines()[-1] == "2 site(s) checked; errors in ['bad']"


def test_site_folders_lists_sub_folders_sorted_and_rejects_empty_or_missing_roots(tmp_path):
    for name in ("siteB", "siteA", ".cache"):
        (tmp_path / "root" / name).mkdir(parents=True)
    (tmp_path / "root" / "notes.txt").write_text("")
    (tmp_path / "empty").mkdir()

    assert site_folders(tmp_path / "root") == [tmp_path / "root" / "siteA", tmp_path / "root" / "siteB"]
    with pytest.raises(DataError, match="holds no site folders"):
        site_folders(tmp_path / "empty")
    with pytest.raises(DataError, match="does not exist"):
        site_folders(tmp_path / "missing")
