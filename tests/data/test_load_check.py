"""The data doctor says OK only when training would load the site, and shows what each split holds."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from support.png_sites import fundus_folders, fundus_mask, prostate_folders, save, write_prostate_site

from fedsm_core.command_line.cli import main
from fedsm_core.data.load_check import case_of_id


def check(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["check-data", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_site_without_image_pairs_is_an_error(tmp_path, capsys):
    # Prepare: every folder of the layout exists, but holds nothing
    site = tmp_path / "A"
    for split in ("train", "test"):
        for folder in prostate_folders(site, split):
            folder.mkdir(parents=True)

    # Execute
    status, out, _ = check(capsys, "prostate-slices", str(site))

    # Assert
    assert status == 1
    assert "site A (prostate-slices)" in out and ": ERRORS" in out
    assert "training would not load this site" in out and "no image/mask pairs" in out


def test_a_site_with_one_training_pair_has_no_validation_split_and_is_an_error(tmp_path, capsys):
    write_prostate_site(tmp_path / "A", train=("a",), test=("t1",))

    status, out, _ = check(capsys, "prostate-slices", str(tmp_path / "A"))

    assert status == 1
    assert "training would not load this site" in out and "no val images" in out


def test_a_site_with_an_empty_test_folder_is_an_error(tmp_path, capsys):
    site = write_prostate_site(tmp_path / "A", test=("t1",))
    for folder in prostate_folders(site, "test"):
        for file in folder.iterdir():
            file.unlink()

    status, out, _ = check(capsys, "prostate-slices", str(site))

    assert status == 1
    assert "no test images" in out


def test_a_loadable_site_shows_what_each_split_holds(tmp_path, capsys):
    # 5 training slices: round(0.2 * 5) = 1 goes to validation; each name is its own case here
    site = write_prostate_site(tmp_path / "A", train=("a", "b", "c", "d", "e"), test=("t1", "t2"))

    status, out, _ = check(capsys, "prostate-slices", str(site), "--data-seed", "3")

    assert status == 0
    assert "training loads: train 4, val 1, test 2 images" in out


def write_drishti_root(root: Path, count: int) -> Path:
    """``count`` DoFE pairs named p00.. (half in train, half in test), all drawn from one template."""
    image = np.full((16, 16, 3), 50, np.uint8)
    image[2:10, 2:10, 0] = 200
    for index in range(count):
        image_dir, mask_dir = fundus_folders(root, "train" if index % 2 == 0 else "test")
        save(image_dir / f"p{index:02d}.png", image)
        save(mask_dir / f"p{index:02d}.png", fundus_mask("a"))
    return root


def test_shifted_sites_report_their_own_share_of_the_shared_folder(tmp_path, capsys):
    # Prepare: 40 pairs (20 train, 20 test) -> six sites of 6, 6, 6, 6, 6, 10 images
    # (partition_sizes(40)); val and test get max(1, n // 4): 6 -> 4/1/1, 10 -> 6/2/2.
    root = write_drishti_root(tmp_path / "drishti", 40)
    spec = tmp_path / "fed.toml"
    spec.write_text("".join(f'[[sites]]\nname = "s{k}"\nsource = "drishti-shifted"\npath = "{root}"\npart = {k}\n'
                            for k in range(1, 7)))

    # Execute
    status, out, _ = check(capsys, "--federation", str(spec))

    # Assert
    assert status == 0
    assert "site s1 (drishti-shifted)" in out
    assert out.count("training loads: train 4, val 1, test 1 images") == 5
    assert out.count("training loads: train 6, val 2, test 2 images") == 1
    assert "whole folder, train (shared by all six sites): 20 usable" in out
    assert "\n  train: 20 usable" not in out


def test_a_bad_option_is_named_once_without_a_doubled_prefix(tmp_path, capsys):
    write_prostate_site(tmp_path / "A")

    try:
        main(["check-data", "prostate-slices", str(tmp_path / "A"), "--mask-encoding", "bogus"])
    except SystemExit as stop:
        assert stop.code == 2
    err = capsys.readouterr().err
    assert "bogus" in err
    assert "check-data: check-data" not in err


def test_the_case_of_an_example_id_is_its_middle_part_or_its_name():
    assert case_of_id("BIDMC/Case07/Case07_003") == "Case07"
    assert case_of_id("site-1/drishtiGS_002") == "drishtiGS_002"
    assert case_of_id("HK/Case01/z012") == "Case01"


def test_the_doctor_still_reports_file_errors_without_loading(tmp_path, capsys):
    site = write_prostate_site(tmp_path / "A")
    image_dir, _ = prostate_folders(site, "train")
    shutil.copy(image_dir / "a.png", image_dir / "zz.png")  # an orphan

    status, out, _ = check(capsys, "prostate-slices", str(site))

    assert status == 1
    assert "zz.png (image without mask)" in out
    assert "training would not load" not in out   # the loader would only repeat the orphan


def test_generated_sites_report_their_own_split_sizes(capsys):
    # synthetic-fundus at data-scale 0.5: site-1 has 50 * 0.5 = 25 images (13 / 6 / 6), site-6 400 * 0.5 = 200
    status, out, _ = check(capsys, "--dataset", "synthetic-fundus", "--data-scale", "0.5")

    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "site site-1 (synthetic-fundus) at generated (data-scale 0.5, data-seed 0): OK"
    assert lines[1] == "  training loads: train 13, val 6, test 6 images; cases: train 13, val 6, test 6"
    assert "training loads: train 100, val 50, test 50 images" in lines[11]
    assert lines[-1] == "6 site(s) checked; no errors"
