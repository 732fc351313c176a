"""``fedsm predict`` on NIfTI volumes refuses what it cannot do well: 4-D without --modality, mixed folders, ..."""

from __future__ import annotations

import csv
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image
from support.prostate_volumes import SHAPE, gland, mr_image, snapshot, threshold_predictor, write_volume

from fedsm_core.command_line.cli import main
from fedsm_core.data.files import DataError
from fedsm_core.inference.predict_volumes import predict_volume_folder
from fedsm_core.inference.volume_files import check_modality, list_input_volumes, mask_volume_name, read_volume_input
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.run_files.bundle import save_global_model

SPEC = ModelSpec("mobilenet_v2", 1, 2, 8)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    """A small random prostate global_model.pt (what it draws does not matter here)."""
    torch.manual_seed(0)
    return save_global_model(tmp_path_factory.mktemp("model") / "global_model.pt", SPEC, ("prostate",), 32,
                             get_weights(SPEC.build_segmentation()), {"preprocessing": "percentile"})


def four_d() -> np.ndarray:
    """``[48, 40, 6, 2]``: channel 0 is flat (segments to nothing), channel 1 shows the gland."""
    return np.stack([np.full(SHAPE, 300, np.int16), mr_image(gland())], axis=-1)


def predict(model: Path, images: Path, out: Path, *extra: str) -> int:
    return main(["predict", "--model", str(model), "--images", str(images), "--out", str(out), "--device", "cpu",
                 *extra])


def labels_of(path: Path) -> np.ndarray:
    return np.asanyarray(nib.load(path).dataobj)


def test_a_4d_volume_without_modality_is_refused_naming_the_file_and_its_shape(model_file, tmp_path, capsys):
    # Prepare
    volume = write_volume(tmp_path / "msd" / "prostate_00.nii.gz", four_d())
    write_volume(tmp_path / "msd" / "prostate_01.nii.gz", mr_image(gland()))  # a 3-D one is fine
    before = snapshot(tmp_path / "msd")

    # Execute
    status = predict(model_file, volume.parent, tmp_path / "out")

    # Assert
    err = capsys.readouterr().err
    assert status == 1
    assert f"{volume} has shape (48, 40, 6, 2)" in err and "1 volume(s)" in err
    assert "pass --modality N (0..1)" in err and "0 = T2, 1 = ADC" in err
    assert not (tmp_path / "out").exists() and snapshot(tmp_path / "msd") == before


def test_modality_chooses_the_channel_of_a_4d_volume(tmp_path):
    # Prepare: the same gland image as a 3-D volume and as channel 1 of a 4-D one
    volumes = write_volume(tmp_path / "in" / "a.nii.gz", four_d()).parent
    write_volume(volumes / "b.nii.gz", mr_image(gland()))
    masks = {}

    # Execute
    for modality in (0, 1):
        out = tmp_path / f"out{modality}"
        table, failures = predict_volume_folder(threshold_predictor(64), volumes, out, modality,
                                                torch.device("cpu"), 8, False)
        assert failures == []
        masks[modality] = {name: labels_of(out / mask_volume_name(Path(name))) for name in ("a.nii.gz", "b.nii.gz")}

    # Assert: channel 1 is segmented as the 3-D volume is; the flat channel 0 gives nothing
    assert masks[1]["a.nii.gz"].shape == SHAPE and masks[1]["a.nii.gz"].sum() > 1000
    np.testing.assert_array_equal(masks[1]["a.nii.gz"], masks[1]["b.nii.gz"])
    assert masks[0]["a.nii.gz"].sum() == 0
    np.testing.assert_array_equal(masks[0]["b.nii.gz"], masks[1]["b.nii.gz"])  # 3-D volumes ignore --modality


def test_modality_through_the_command_gives_a_3d_mask_with_the_inputs_affine(model_file, tmp_path):
    # Prepare
    volume = write_volume(tmp_path / "msd" / "prostate_00.nii.gz", four_d())

    # Execute
    status = predict(model_file, volume.parent, tmp_path / "out", "--modality", "1")

    # Assert
    assert status == 0
    mask = nib.load(tmp_path / "out" / "prostate_00_segmentation.nii.gz")
    assert mask.shape == SHAPE and mask.header["dim"][0] == 3
    np.testing.assert_allclose(mask.affine, nib.load(volume).affine)
    with (tmp_path / "out" / "predictions.csv").open(newline="") as handle:
        assert [row["shape"] for row in csv.DictReader(handle)] == ["48x40x6x2"]


def test_a_modality_the_volume_lacks_is_listed_and_the_others_are_written(model_file, tmp_path, capsys):
    # Prepare
    folder = write_volume(tmp_path / "in" / "a.nii.gz", four_d()).parent
    write_volume(folder / "b.nii.gz", mr_image(gland()))

    # Execute
    status = predict(model_file, folder, tmp_path / "out", "--modality", "2")

    # Assert
    captured = capsys.readouterr()
    assert status == 1
    assert "a.nii.gz has 2 channel(s)" in captured.err and "modality = 2 does not exist" in captured.err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["b_segmentation.nii.gz", "predictions.csv"]


def test_modality_checks(tmp_path):
    volume = read_volume_input(write_volume(tmp_path / "a.nii.gz", mr_image(gland())))

    with pytest.raises(ValueError, match="--modality -1 must be >= 0"):
        check_modality([volume], -1, tmp_path)
    with pytest.warns(UserWarning, match="--modality 1 is unused: every volume .* is 3-D"):
        check_modality([volume], 1, tmp_path)


def test_modality_with_2d_images_is_refused(model_file, tmp_path, capsys):
    (tmp_path / "images").mkdir()
    Image.fromarray(np.zeros((20, 30), np.uint8)).save(tmp_path / "images" / "a.png")

    status = predict(model_file, tmp_path / "images", tmp_path / "out", "--modality", "0")

    assert status == 1
    assert "--modality 0 applies to NIfTI volumes only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_folder_mixing_images_and_volumes_is_refused(model_file, tmp_path, capsys):
    folder = write_volume(tmp_path / "in" / "Case00.nii.gz", mr_image(gland())).parent
    Image.fromarray(np.zeros((20, 30), np.uint8)).save(folder / "slice.png")

    status = predict(model_file, folder, tmp_path / "out")

    err = capsys.readouterr().err
    assert status == 1
    assert "mixes 1 2-D image(s) (slice.png) and 1 NIfTI volume(s) (Case00.nii.gz)" in err and "two folders" in err
    assert not (tmp_path / "out").exists()


def test_label_volumes_are_left_out_and_one_case_in_two_files_is_refused(tmp_path):
    folder = write_volume(tmp_path / "site" / "Case00.nii.gz", mr_image(gland())).parent
    write_volume(folder / "Case00_Segmentation.nii.gz", gland().astype(np.uint8))
    write_volume(folder / ".Case01.nii.gz", mr_image(gland()))  # hidden (macOS ._ files)

    with pytest.warns(UserWarning, match="1 label volume.*Case00_Segmentation.nii.gz.*not segmented"):
        assert [p.name for p in list_input_volumes(folder)] == ["Case00.nii.gz"]
    write_volume(folder / "Case00.nii", mr_image(gland()))
    with pytest.raises(DataError, match=r"\['Case00.nii', 'Case00.nii.gz'\] are one case"), pytest.warns(UserWarning):
        list_input_volumes(folder)
    (folder / "Case00.nii").unlink()
    (folder / "Case00.nii.gz").unlink()
    with pytest.raises(DataError, match="no image volumes .* besides label volumes"), pytest.warns(UserWarning):
        list_input_volumes(folder)


def test_an_unreadable_volume_is_listed_and_the_others_are_written(model_file, tmp_path, capsys):
    folder = write_volume(tmp_path / "in" / "good.nii.gz", mr_image(gland())).parent
    (folder / "broken.nii.gz").write_bytes(b"not a nifti file")

    status = predict(model_file, folder, tmp_path / "out")

    captured = capsys.readouterr()
    assert status == 1
    assert "cannot read image volume" in captured.err and "broken.nii.gz" in captured.err
    assert "1 image(s) unreadable" in captured.out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["good_segmentation.nii.gz", "predictions.csv"]


@pytest.mark.parametrize("where", ["same", "inside"])
def test_an_out_folder_in_the_volumes_folder_is_refused(model_file, tmp_path, capsys, where):
    folder = write_volume(tmp_path / "in" / "Case00.nii.gz", mr_image(gland())).parent
    before = snapshot(tmp_path)

    status = predict(model_file, folder, folder if where == "same" else folder / "masks")

    assert status == 1
    assert "pass an --out folder outside" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_a_second_run_needs_overwrite_which_replaces_only_the_listed_masks(model_file, tmp_path, capsys):
    # Prepare
    folder = write_volume(tmp_path / "in" / "Case00.nii.gz", mr_image(gland())).parent
    out = tmp_path / "out"
    assert predict(model_file, folder, out) == 0
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)

    # Execute
    refused = predict(model_file, folder, out)
    after_refusal = snapshot(out)
    (folder / "Case00.nii.gz").rename(folder / "Case01.nii.gz")
    replaced = predict(model_file, folder, out, "--overwrite")

    # Assert
    assert refused == 1 and "--overwrite" in capsys.readouterr().err
    assert after_refusal == before
    assert replaced == 0
    assert sorted(p.name for p in out.iterdir()) == ["Case01_segmentation.nii.gz", "notes.txt", "predictions.csv"]
