"""``fedsm predict`` on NIfTI volumes: aligned label volumes, per-slice routing, training's preprocessing."""

from __future__ import annotations

import csv
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from support.prostate_volumes import (
    AFFINE,
    SHAPE,
    SPACING,
    gland,
    mr_image,
    oracle_predictor,
    snapshot,
    write_volume,
)

from fedsm_core.command_line.cli import main
from fedsm_core.data.preprocess import prepare_example
from fedsm_core.inference.predict_volumes import (
    VOLUME_CSV_COLUMNS,
    label_map,
    predict_volume_folder,
    prepare_slice,
    summarize_routes,
)
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.run_files.bundle import BundleInfo, save_bundle, save_global_model


def read_table(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == VOLUME_CSV_COLUMNS
        return list(reader)


def constant_unet(spec: ModelSpec, *present: bool) -> torch.nn.Module:
    """A U-Net predicting structure k everywhere (``present[k]``) or nowhere, whatever the slice."""
    model = spec.build_segmentation()
    head = model.segmentation_head[0]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([10.0 if p else -10.0 for p in present]))
    return model


@pytest.fixture()
def volumes(tmp_path) -> Path:
    """``Case00.nii.gz``: the 48 x 40 x 6 gland volume with the anisotropic, rotated affine."""
    return write_volume(tmp_path / "volumes" / "Case00.nii.gz", mr_image(gland())).parent


def test_a_perfect_model_gives_back_the_gland_voxel_for_voxel_on_the_input_grid(volumes, tmp_path):
    # Prepare: the model's size 64 exceeds both sides of a slice, so no detail is lost on the way
    before = snapshot(volumes)
    predictor = oracle_predictor(gland(), 64, routes=("global", "global", "site-a"))
    out = tmp_path / "out"

    # Execute
    table, failures = predict_volume_folder(predictor, volumes, out, None, torch.device("cpu"), 4, False)

    # Assert
    assert failures == []
    mask = nib.load(out / "Case00_segmentation.nii.gz")
    labels = np.asanyarray(mask.dataobj)
    assert labels.shape == SHAPE and labels.dtype == np.uint8
    np.testing.assert_array_equal(labels, gland().astype(np.uint8))  # 1 = prostate, 0 = background
    np.testing.assert_allclose(mask.affine, AFFINE, atol=1e-6)
    np.testing.assert_allclose(mask.header.get_zooms(), SPACING, atol=1e-6)
    assert (int(mask.header["qform_code"]), int(mask.header["sform_code"])) == (1, 1)
    assert snapshot(volumes) == before
    # slices 0..5 routed global, global, site-a, global, global, site-a: 4/6 and 2/6
    assert read_table(table) == [{"image": "Case00.nii.gz", "mask": "Case00_segmentation.nii.gz",
                                  "shape": "48x40x6", "slices": "6", "model": "global",
                                  "routes": "global=0.6667;site-a=0.3333", "selector-confidence": "0.9000",
                                  "most-likely-site": "site-a"}]
    assert sorted(p.name for p in out.iterdir()) == ["Case00_segmentation.nii.gz", "predictions.csv"]


def test_a_model_file_segments_every_slice_and_the_mask_keeps_the_header(volumes, tmp_path, capsys):
    # Prepare: a prostate model that finds prostate everywhere; a second, uncompressed volume
    spec = ModelSpec("mobilenet_v2", 1, 2, 8)
    model = save_global_model(tmp_path / "global_model.pt", spec, ("prostate",), 32,
                              get_weights(constant_unet(spec, True)), {"preprocessing": "percentile"})
    write_volume(volumes / "Case01.nii", mr_image(gland(), seed=1)[:, :30])
    out = tmp_path / "out"

    # Execute
    status = main(["predict", "--model", str(model), "--images", str(volumes), "--out", str(out),
                   "--device", "cpu", "--batch-size", "4"])

    # Assert
    assert status == 0
    assert "wrote 2 mask(s)" in capsys.readouterr().out
    rows = read_table(out / "predictions.csv")
    assert [(r["image"], r["mask"], r["shape"], r["slices"]) for r in rows] == [
        ("Case00.nii.gz", "Case00_segmentation.nii.gz", "48x40x6", "6"),
        ("Case01.nii", "Case01_segmentation.nii.gz", "48x30x6", "6")]
    assert [(r["model"], r["routes"], r["selector-confidence"]) for r in rows] == [("global", "global=1.0000", "")] * 2
    for row, shape in zip(rows, [(48, 40, 6), (48, 30, 6)], strict=True):
        mask = nib.load(out / row["mask"])
        assert np.asanyarray(mask.dataobj).dtype == np.uint8
        np.testing.assert_array_equal(np.asanyarray(mask.dataobj), np.ones(shape, np.uint8))
        np.testing.assert_allclose(mask.affine, AFFINE, atol=1e-6)
        assert mask.header.get_intent()[0] == "label"
        assert mask.header["descrip"].item() == b"fedsm predict 1=prostate"


def test_a_super_model_routes_each_slice_and_the_row_counts_the_routes(tmp_path):
    # Prepare: global draws disc only (label 1), site-a disc and cup (label 2 over 1), site-b nothing.
    # The seeded random selector is 0.61..0.89 sure of site-a on these six slices (zeros, noise, two ramps,
    # a checkerboard, a box); gamma 0.8 sends about half of them to the global model.
    spec = ModelSpec("mobilenet_v2", 2, 2, 8)
    torch.manual_seed(0)
    selector = get_weights(spec.build_selector())
    info = BundleInfo(spec, ("site-a", "site-b"), ("disc", "cup"), 0.8, 32, {"preprocessing": "percentile"})
    bundle = save_bundle(tmp_path / "super_model.pt", info, get_weights(constant_unet(spec, True, False)),
                         [get_weights(constant_unet(spec, True, True)), get_weights(constant_unet(spec, False, False))],
                         selector)
    ramp = np.tile(np.linspace(0, 1, 40), (40, 1))
    slices = [np.zeros((40, 40)), np.random.default_rng(0).random((40, 40)), ramp, ramp.T,
              np.indices((40, 40)).sum(0) % 2, np.pad(np.ones((10, 10)), 15)]
    volumes = write_volume(tmp_path / "volumes" / "Case07.nii.gz", np.stack(slices, axis=-1).astype(np.float32)).parent
    out = tmp_path / "out"

    # Execute
    assert main(["predict", "--model", str(bundle), "--images", str(volumes), "--out", str(out),
                 "--device", "cpu", "--batch-size", "4"]) == 0

    # Assert: each slice's labels are the constant of the model that segmented it
    (row,) = read_table(out / "predictions.csv")
    labels = np.asanyarray(nib.load(out / row["mask"]).dataobj)
    per_slice = [set(np.unique(labels[:, :, z]).tolist()) for z in range(6)]
    assert all(len(values) == 1 for values in per_slice)
    model_of = {1: "global", 2: "site-a", 0: "site-b"}
    routed = [model_of[values.pop()] for values in per_slice]
    shares = dict(part.split("=") for part in row["routes"].split(";"))
    assert len(set(routed)) == 2, routed  # both the global model and site-a's segmented slices
    assert shares == {name: f"{routed.count(name) / 6:.4f}" for name in set(routed)}
    assert routed.count(row["model"]) == max(routed.count(name) for name in routed)
    assert row["most-likely-site"] in ("site-a", "site-b") and 0.5 <= float(row["selector-confidence"]) <= 1


# ---------------------------------------------------------------- helpers

def test_prepare_slice_is_the_training_loaders_preparation_of_a_slice():
    # A 48 x 40 slice stretched to 32 x 32 and percentile-normalised, as prepare_example does in training
    image = np.random.default_rng(0).random((48, 40)).astype(np.float32) * 900

    expected, _ = prepare_example(image, np.zeros((1, 48, 40), bool), 32)

    np.testing.assert_array_equal(prepare_slice(image, 32, "percentile"), expected)
    assert prepare_slice(image, 32, "percentile").shape == (3, 32, 32)


def test_label_map_numbers_structures_from_one_with_later_ones_on_top():
    binary = np.zeros((2, 2, 3), dtype=bool)
    binary[0] = [[True, True, False], [False, True, False]]
    binary[1] = [[False, True, False], [False, False, True]]

    labels = label_map(binary)

    assert labels.dtype == np.uint8
    np.testing.assert_array_equal(labels, [[1, 2, 0], [0, 1, 2]])
    np.testing.assert_array_equal(label_map(binary[:1]), [[1, 1, 0], [0, 1, 0]])


def test_summarize_routes_takes_the_most_frequent_route_and_the_mean_confidence():
    slices = [{"model": "site-b", "selector-confidence": "0.6000", "most-likely-site": "site-b"},
              {"model": "global", "selector-confidence": "0.9000", "most-likely-site": "site-a"},
              {"model": "global", "selector-confidence": "0.8000", "most-likely-site": "site-a"}]

    summary = summarize_routes(slices)

    # global 2 of 3, site-b 1 of 3; confidence (0.6 + 0.9 + 0.8) / 3 = 0.7667
    assert summary == {"model": "global", "routes": "global=0.6667;site-b=0.3333",
                       "selector-confidence": "0.7667", "most-likely-site": "site-a"}
    single = [{"model": "global", "selector-confidence": "", "most-likely-site": ""}] * 2
    assert summarize_routes(single) == {"model": "global", "routes": "global=1.0000", "selector-confidence": "",
                                        "most-likely-site": ""}
    # a tie goes to the earliest slice's route
    assert summarize_routes(slices[:2])["model"] == "site-b"
