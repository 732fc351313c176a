"""Case-level splits for slice layouts: slices of one case never straddle train and validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.png_sites import prostate_folders, prostate_mask

from fedsm_core.command_line.cli import main
from fedsm_core.data.cases import CASE_PATTERNS, case_of, compile_case_pattern, named_case, slice_number
from fedsm_core.data.files import DataError
from fedsm_core.data.png_layouts import load_png_site
from fedsm_core.data.sources import data_source


def write_slices(site: Path, train: list[str], test: list[str]) -> Path:
    image = np.full((16, 16), 50, np.uint8)
    image[2:10, 2:10] = 200
    for split, stems in (("train", train), ("test", test)):
        for folder in prostate_folders(site, split):
            folder.mkdir(parents=True, exist_ok=True)
        image_dir, mask_dir = prostate_folders(site, split)
        for stem in stems:
            Image.fromarray(image).save(image_dir / f"{stem}.png")
            Image.fromarray(prostate_mask("a")).save(mask_dir / f"{stem}.png")
    return site


THREE_CASES = [f"{case}_{z:02d}" for case in ("00", "01", "02") for z in range(1, 6)]


def cases_in(ids) -> set[str]:
    return {i.split("/")[1] for i in ids}


@pytest.mark.parametrize("seed", range(5))
def test_three_cases_of_five_slices_split_by_whole_cases(tmp_path, seed):
    # Prepare: round(0.2 * 3 cases) = 1 case (5 slices) goes to validation
    site = write_slices(tmp_path / "A", THREE_CASES, ["10_01", "10_02"])

    # Execute
    splits = load_png_site(site, "prostate-slices", 8, seed)

    # Assert
    assert len(splits.train) == 10 and len(splits.val) == 5
    assert len(cases_in(splits.train.ids)) == 2 and len(cases_in(splits.val.ids)) == 1
    assert not cases_in(splits.train.ids) & cases_in(splits.val.ids)
    assert all(i.startswith(f"A/{i.split('/')[1]}/") for i in splits.val.ids)   # A/<case>/<case>_<slice>
    assert cases_in(splits.test.ids) == {"10"}


def test_the_default_patterns_name_the_case_of_each_layout():
    slices = compile_case_pattern(CASE_PATTERNS["prostate-slices"], "test")
    fundus = compile_case_pattern(CASE_PATTERNS["fundus-dofe"], "test")

    assert [case_of(s, slices, "f") for s in ("00_01", "Case07_003", "a_b_12", "s00", "img_x")] == \
        ["00", "Case07", "a_b", "s00", "img_x"]
    assert case_of("drishtiGS_002", fundus, "f") == "drishtiGS_002"


def test_a_case_pattern_setting_changes_the_case(tmp_path):
    stems = [f"P{p}-slice{z}" for p in (1, 2, 3, 4, 5) for z in (1, 2)]
    site = write_slices(tmp_path / "A", stems, ["P9-slice1"])

    splits = load_png_site(site, "prostate-slices", 8, 0, case_pattern=r"(P\d+)-slice\d+")

    assert len(cases_in(splits.val.ids)) == 1 and len(splits.val) == 2   # round(0.2 * 5) = 1 case
    assert not cases_in(splits.train.ids) & cases_in(splits.val.ids)
    with pytest.raises(DataError, match=r"'P1-slice1' .* does not match case-pattern = 'Q\(\\d\+\)'"):
        load_png_site(site, "prostate-slices", 8, 0, case_pattern=r"Q(\d+)")


def test_a_train_folder_of_one_case_is_an_error_naming_the_fix(tmp_path):
    site = write_slices(tmp_path / "A", ["00_01", "00_02", "00_03"], ["01_01"])

    with pytest.raises(DataError, match=r"3 files of one case \('00'.*val-split = \"file\""):
        load_png_site(site, "prostate-slices", 8, 0)
    assert len(load_png_site(site, "prostate-slices", 8, 0, case_pattern="(.+)").val) == 1  # split by file, if asked


def test_val_split_by_file_draws_validation_from_one_case_and_the_ids_keep_their_case(tmp_path):
    # Prepare: five slices of patient 00 to train on, two of patient 01 to test
    site = write_slices(tmp_path / "A", [f"00_0{z}" for z in range(1, 6)], ["01_01", "01_02"])

    # Execute
    splits = load_png_site(site, "prostate-slices", 8, 0, val_split="file")

    # Assert: round(0.2 * 5) = 1 file to validation; every id still names its patient
    assert (len(splits.train), len(splits.val)) == (4, 1)
    assert cases_in(splits.train.ids) == cases_in(splits.val.ids) == {"00"}
    assert cases_in(splits.test.ids) == {"01"}
    with pytest.raises(ValueError, match=r"val-split = 'slice' must be one of \['case', 'file'\]"):
        load_png_site(site, "prostate-slices", 8, 0, val_split="slice")
    with pytest.raises(ValueError, match=r"spec x: val-split = 'slice' must be one of"):
        data_source("prostate-slices").options({"val-split": "slice"}, "spec x")


def test_a_pattern_without_a_group_is_refused_where_it_is_set():
    with pytest.raises(ValueError, match=r"spec x: case-pattern = '\\\\d\+' has no group"):
        data_source("prostate-slices").options({"case-pattern": r"\d+"}, "spec x")


def test_the_doctor_reports_cases_per_split(tmp_path, capsys):
    write_slices(tmp_path / "A", THREE_CASES, ["10_01", "10_02", "11_01"])

    status = main(["check-data", "prostate-slices", str(tmp_path / "A")])

    out = capsys.readouterr().out
    assert status == 0
    assert "training loads: train 10, val 5, test 3 images; cases: train 2, val 1, test 2" in out


@pytest.mark.parametrize(("example", "case", "number"), [
    ("BIDMC/Case07/z012", "BIDMC/Case07", 12),     # a NIfTI volume's slice
    ("site-1/00/00_01", "site-1/00", 1),           # a prostate-slices file of case 00
    ("site-2/case004/z007", "site-2/case004", 7),  # a generated case
    ("site-3/0007", None, 7),                      # an image that is its own case (fundus)
    ("lonely", None, None),
])
def test_an_example_id_names_its_case_and_slice_number(example, case, number):
    assert named_case(example) == case
    assert slice_number(example) == number
