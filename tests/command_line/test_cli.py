"""The ``fedsm`` command: the data doctor's output and exit status."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.png_sites import prostate_folders, write_fundus_site, write_prostate_site

from fedsm_core.command_line.cli import build_parser, main


def test_a_clean_folder_of_sites_passes_with_counts_per_split(tmp_path, capsys):
    write_prostate_site(tmp_path / "A")
    write_prostate_site(tmp_path / "B")

    status = main(["check-data", "prostate-slices", str(tmp_path)])

    out = capsys.readouterr().out
    assert status == 0
    assert "site A (prostate-slices)" in out and "site B (prostate-slices)" in out
    assert "train: 5 usable, sizes 16x16 x5, mask values {0, 255}" in out
    assert out.strip().endswith("2 site(s) checked; no errors")


def test_an_orphan_fails_unless_skipped_and_is_named(tmp_path, capsys):
    site = write_prostate_site(tmp_path / "A")
    image_dir, _ = prostate_folders(site, "train")
    (image_dir / "a.png").rename(image_dir / "zz.png")

    assert main(["check-data", "prostate-slices", str(site)]) == 1
    out = capsys.readouterr().out
    assert "zz.png (image without mask)" in out and "a.png (mask without image)" in out
    assert main(["check-data", "prostate-slices", str(site), "--on-orphans", "skip"]) == 0
    assert "orphans are skipped" in capsys.readouterr().out


def test_the_wrong_mask_encoding_is_an_error_naming_the_values(tmp_path, capsys):
    write_fundus_site(tmp_path / "F")

    status = main(["check-data", "fundus-dofe", str(tmp_path / "F"), "--mask-encoding", "binary"])

    out = capsys.readouterr().out
    assert status == 1
    assert "[128] outside the 'binary' encoding" in out


def test_a_federation_spec_is_checked_site_by_site(tmp_path, capsys):
    write_prostate_site(tmp_path / "data" / "north")
    spec = tmp_path / "fed.toml"
    spec.write_text('[[sites]]\nname = "north"\nsource = "prostate-slices"\npath = "data/north"\n'
                    '[[sites]]\nname = "south"\nsource = "prostate-slices"\n')

    status = main(["check-data", "--federation", str(spec)])

    out = capsys.readouterr().out
    assert status == 1
    assert "site north (prostate-slices)" in out and ": OK" in out
    assert "no 'path' in" in out


def test_a_missing_root_is_reported_without_a_traceback(tmp_path, capsys):
    assert main(["check-data", "prostate-slices", str(tmp_path / "nowhere")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_source_and_root_are_required_without_a_spec():
    with pytest.raises(SystemExit) as stop:
        main(["check-data", "prostate-slices"])
    assert stop.value.code == 2


def test_predict_help_names_every_model_file_it_takes(capsys):
    # Execute
    with pytest.raises(SystemExit) as stop:
        main(["predict", "--help"])

    # Assert
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    assert stop.value.code == 0
    assert "super_model.pt" in out and "global_model.pt" in out and "site_models/<site>.pt" in out
    assert "super models only" in out


def test_predict_help_names_volumes_and_the_modality_of_4d_ones(capsys):
    # Execute
    with pytest.raises(SystemExit) as stop:
        main(["predict", "--help"])

    # Assert
    out = " ".join(capsys.readouterr().out.split())
    assert stop.value.code == 0
    assert "--modality MODALITY" in out and "NIfTI volumes (.nii, .nii.gz)" in out
    assert "required for 4-D volumes" in out


def test_predict_modality_must_be_a_whole_number(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["predict", "--model", "m.pt", "--images", "in", "--out", "out", "--modality", "T2"])

    assert stop.value.code == 2
    assert "--modality: invalid int value: 'T2'" in capsys.readouterr().err


def test_predict_route_by_takes_image_or_case_and_defaults_to_the_bundles():
    # Prepare
    parser = build_parser()
    required = ["predict", "--model", "m.pt", "--images", "in", "--out", "out"]

    # Execute / Assert: None means "the bundle's route-by"
    assert parser.parse_args(required).route_by is None
    assert parser.parse_args([*required, "--route-by", "case"]).route_by == "case"
    assert parser.parse_args([*required, "--route-by", "image"]).route_by == "image"


def test_predict_route_by_refuses_other_values_and_is_in_the_help(capsys):
    # Execute / Assert
    with pytest.raises(SystemExit) as stop:
        main(["predict", "--model", "m.pt", "--images", "in", "--out", "out", "--route-by", "patient"])
    assert stop.value.code == 2
    assert "--route-by: invalid choice: 'patient'" in capsys.readouterr().err  # argparse lists image, case
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--route-by {image,case}" in out and "default: the bundle's route-by" in out


def test_the_fedsm_command_of_pyproject_points_at_the_cli():
    # The console script a user runs as `fedsm`: a moved module must not leave it dangling
    import importlib

    import tomllib

    root = Path(__file__).resolve().parents[2]
    target = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]["fedsm"]
    module, _, function = target.partition(":")
    assert getattr(importlib.import_module(module), function) is main
