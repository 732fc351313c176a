"""``fedsm predict``: masks of the input's size, the predictions table, and its errors.

Both model files are covered: the super-model bundle and a single (global) model.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedsm_core.command_line.cli import main
from fedsm_core.data.files import DataError, read_image
from fedsm_core.inference.letterbox import letterbox_for, restore_probabilities
from fedsm_core.inference.predict import (
    CSV_COLUMNS,
    encode_mask,
    list_input_images,
    predict_folder,
    prepare_input,
)
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.run_files.bundle import BundleInfo, save_bundle, save_global_model

SPEC = ModelSpec("mobilenet_v2", 2, 2, 8)
SITES = ("site-a", "site-b")


def constant_unet(disc: bool, cup: bool) -> torch.nn.Module:
    """A U-Net predicting each structure everywhere (True) or nowhere (False), whatever the image."""
    model = SPEC.build_segmentation()
    head = model.segmentation_head[0]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([10.0 if disc else -10.0, 10.0 if cup else -10.0]))
    return model


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """Global model: disc only (mask 128); site-a: disc and cup (255); site-b: nothing (0)."""
    torch.manual_seed(0)
    info = BundleInfo(SPEC, SITES, ("disc", "cup"), 0.5, 32, {"preprocessing": "percentile"})
    return save_bundle(tmp_path_factory.mktemp("bundle") / "super_model.pt", info,
                       get_weights(constant_unet(True, False)),
                       [get_weights(constant_unet(True, True)), get_weights(constant_unet(False, False))],
                       get_weights(SPEC.build_selector()))


@pytest.fixture()
def images(tmp_path) -> Path:
    """A 50 x 70 (width x height) RGB PNG and a 100 x 40 grey JPEG."""
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (70, 50, 3), dtype=np.uint8), "RGB").save(folder / "colour.png")
    Image.fromarray(np.tile(np.linspace(0, 255, 100).astype(np.uint8), (40, 1)), "L").save(folder / "grey.jpg")
    return folder


def read_table(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        return list(reader)


EXPECTED_MASK_VALUE = {"global": 128, "site-a": 255, "site-b": 0}


def test_predict_writes_one_mask_of_the_input_size_per_image_and_a_table(bundle, images, tmp_path, capsys):
    out = tmp_path / "out"

    status = main(["predict", "--model", str(bundle), "--images", str(images), "--out", str(out), "--device", "cpu"])

    assert status == 0
    assert "predictions.csv" in capsys.readouterr().out
    rows = read_table(out / "predictions.csv")
    assert [row["image"] for row in rows] == ["colour.png", "grey.jpg"]
    assert [row["mask"] for row in rows] == ["colour.png", "grey.png"]
    assert [(row["width"], row["height"]) for row in rows] == [("50", "70"), ("100", "40")]
    for row in rows:
        mask = Image.open(out / row["mask"])
        assert mask.size == (int(row["width"]), int(row["height"]))
        values = np.asarray(mask)
        assert set(np.unique(values).tolist()) <= {0, 128, 255}
        assert row["model"] in ("global", *SITES)
        # each candidate model draws one known constant mask: the mask shows which model ran
        assert np.all(values == EXPECTED_MASK_VALUE[row["model"]])
        assert row["most-likely-site"] in SITES
        assert 0.5 <= float(row["selector-confidence"]) <= 1.0
        if row["model"] != "global":
            assert row["model"] == row["most-likely-site"] and float(row["selector-confidence"]) > 0.5
    assert sorted(p.name for p in out.iterdir()) == ["colour.png", "grey.png", "predictions.csv"]


def test_gamma_one_routes_every_image_to_the_global_model(bundle, images, tmp_path):
    out = tmp_path / "out"

    assert main(["predict", "--model", str(bundle), "--images", str(images), "--out", str(out),
                 "--gamma", "1.0", "--device", "cpu"]) == 0

    rows = read_table(out / "predictions.csv")
    assert [row["model"] for row in rows] == ["global", "global"]
    for row in rows:
        assert np.all(np.asarray(Image.open(out / row["mask"])) == 128)  # the global model: disc only


def test_gamma_zero_routes_every_image_to_its_most_likely_site(bundle, images, tmp_path):
    table, failures = predict_folder(bundle, images, tmp_path / "out", gamma=0.0)

    rows = read_table(table)
    assert failures == []
    assert [row["model"] for row in rows] == [row["most-likely-site"] for row in rows]


def test_a_gamma_outside_zero_one_is_refused(bundle, images, tmp_path, capsys):
    status = main(["predict", "--model", str(bundle), "--images", str(images), "--out", str(tmp_path / "o"),
                   "--gamma", "1.5", "--device", "cpu"])

    assert status == 1
    assert "--gamma 1.5 must be in [0, 1]" in capsys.readouterr().err


def test_an_unreadable_image_is_listed_and_the_others_are_still_written(bundle, images, tmp_path, capsys):
    (images / "broken.png").write_bytes(b"this is not a png")
    out = tmp_path / "out"

    status = main(["predict", "--model", str(bundle), "--images", str(images), "--out", str(out), "--device", "cpu"])

    captured = capsys.readouterr()
    assert status == 1
    assert "broken.png" in captured.err and "skipped" in captured.err
    assert "1 image(s) unreadable" in captured.out
    assert [row["image"] for row in read_table(out / "predictions.csv")] == ["colour.png", "grey.jpg"]
    assert (out / "colour.png").is_file() and (out / "grey.png").is_file() and not (out / "broken.png").exists()


def test_a_corrupt_bundle_is_an_error_naming_its_path(images, tmp_path, capsys):
    corrupt = tmp_path / "super_model.pt"
    corrupt.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())

    status = main(["predict", "--model", str(corrupt), "--images", str(images), "--out", str(tmp_path / "out")])

    err = capsys.readouterr().err
    assert status == 1
    assert str(corrupt) in err and "not a readable FedSM bundle" in err
    assert "Traceback" not in err


def test_a_missing_bundle_is_an_error_naming_its_path(images, tmp_path, capsys):
    missing = tmp_path / "nowhere" / "super_model.pt"

    status = main(["predict", "--model", str(missing), "--images", str(images), "--out", str(tmp_path / "out")])

    err = capsys.readouterr().err
    assert status == 1
    assert str(missing) in err and "does not exist" in err


def test_two_images_with_the_same_stem_are_an_error(bundle, images, tmp_path, capsys):
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(images / "colour.jpg")

    with pytest.raises(DataError, match="share a name"):
        list_input_images(images)
    status = main(["predict", "--model", str(bundle), "--images", str(images), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 1
    assert "colour.jpg" in err and "colour.png" in err


def test_a_folder_without_images_is_an_error(tmp_path):
    (tmp_path / "notes.txt").write_text("no images here")

    with pytest.raises(DataError, match="holds no image files"):
        list_input_images(tmp_path)
    with pytest.raises(DataError, match="is not a folder"):
        list_input_images(tmp_path / "missing")


# ---------------------------------------------------------------- single (global) models

@pytest.fixture(scope="module")
def global_model(tmp_path_factory) -> Path:
    """A global_model.pt that draws the disc everywhere (mask 128), whatever the image."""
    return save_global_model(tmp_path_factory.mktemp("single") / "global_model.pt", SPEC, ("disc", "cup"), 32,
                             get_weights(constant_unet(True, False)), {"preprocessing": "percentile"})


def test_a_global_model_segments_every_image_and_the_table_says_global(global_model, images, tmp_path, capsys):
    # Prepare
    out = tmp_path / "out"

    # Execute
    status = main(["predict", "--model", str(global_model), "--images", str(images), "--out", str(out),
                   "--device", "cpu"])

    # Assert
    assert status == 0
    assert "predictions.csv" in capsys.readouterr().out
    rows = read_table(out / "predictions.csv")
    assert [row["image"] for row in rows] == ["colour.png", "grey.jpg"]
    assert [(row["width"], row["height"]) for row in rows] == [("50", "70"), ("100", "40")]
    assert [row["model"] for row in rows] == ["global", "global"]
    assert [(row["selector-confidence"], row["most-likely-site"]) for row in rows] == [("", ""), ("", "")]
    for row in rows:
        mask = Image.open(out / row["mask"])
        assert mask.size == (int(row["width"]), int(row["height"]))
        assert np.all(np.asarray(mask) == 128)  # disc only
    assert sorted(p.name for p in out.iterdir()) == ["colour.png", "grey.png", "predictions.csv"]


def test_a_global_model_gives_the_masks_of_running_it_on_the_prepared_input(images, tmp_path):
    # Prepare: random HarmoFL-style weights; no "preprocessing" in extra, so the default "unit" applies
    torch.manual_seed(3)
    spec = ModelSpec("mobilenet_v2", 2, 2, 8, amplitude_size=32)
    model = spec.build_segmentation().eval()
    model.amplitude_norm.freeze(torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(4)) * 40)
    path = save_global_model(tmp_path / "global_model.pt", spec, ("disc", "cup"), 32, get_weights(model))

    # Execute
    table, failures = predict_folder(path, images, tmp_path / "out", batch_size=1)

    # Assert
    assert failures == []
    for row in read_table(table):
        image = read_image(images / row["image"], "RGB")
        with torch.no_grad():
            logits = model(torch.from_numpy(prepare_input(image, 32, "unit"))[None])
        box = letterbox_for(image.shape[0], image.shape[1], 32)
        binary = (restore_probabilities(torch.sigmoid(logits)[0], box) > 0.5).numpy()
        np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "out" / row["mask"])), encode_mask(binary))


def test_gamma_with_a_global_model_is_refused(global_model, images, tmp_path, capsys):
    # Execute
    status = main(["predict", "--model", str(global_model), "--images", str(images), "--out", str(tmp_path / "o"),
                   "--gamma", "0.5", "--device", "cpu"])

    # Assert
    err = capsys.readouterr().err
    assert status == 1
    assert str(global_model) in err and "gamma applies to super models only" in err
    assert not (tmp_path / "o").exists()


def test_another_torch_file_is_refused_naming_both_accepted_formats(images, tmp_path, capsys):
    # Prepare
    other = tmp_path / "model.pt"
    torch.save({"format": "something-else/1"}, other)

    # Execute
    status = main(["predict", "--model", str(other), "--images", str(images), "--out", str(tmp_path / "out")])

    # Assert
    err = capsys.readouterr().err
    assert status == 1
    assert f"'{other}'" in err and "format 'something-else/1'" in err
    assert "'fedsm-super-model/1' or 'fedsm-global-model/1'" in err
    assert "super_model.pt" in err and "global_model.pt" in err and "site_models/<site>.pt" in err


# ---------------------------------------------------------------- helpers

def test_encode_mask_draws_later_structures_over_earlier_ones():
    binary = np.zeros((2, 2, 3), dtype=bool)
    binary[0] = [[True, True, False], [False, True, False]]   # disc
    binary[1] = [[False, True, False], [False, False, True]]  # cup

    grey = encode_mask(binary)

    assert grey.dtype == np.uint8
    np.testing.assert_array_equal(grey, [[128, 255, 0], [0, 128, 255]])
    np.testing.assert_array_equal(encode_mask(binary[:1]), [[255, 255, 0], [0, 255, 0]])  # one structure: 0/255
    three = encode_mask(np.stack([binary[0], binary[1], np.eye(2, 3, dtype=bool)]))
    np.testing.assert_array_equal(three, [[255, 170, 0], [0, 255, 170]])  # 85, 170, 255


def test_prepare_input_unit_divides_by_255_and_goes_channels_first():
    image = np.full((64, 48, 3), 51, dtype=np.uint8)
    image[..., 2] = 255

    x = prepare_input(image, 32, "unit")

    # 64 x 48 -> 32 x 24, padded with 4 zero columns on each side
    assert x.shape == (3, 32, 32) and x.dtype == np.float32
    np.testing.assert_allclose(x[0, :, 4:28], 0.2, atol=1e-6)
    np.testing.assert_allclose(x[1, :, 4:28], 0.2, atol=1e-6)
    np.testing.assert_allclose(x[2, :, 4:28], 1.0, atol=1e-6)
    assert np.all(x[:, :, :4] == 0) and np.all(x[:, :, 28:] == 0)


def test_prepare_input_percentile_stretches_each_image_to_zero_one():
    # a dim grey ramp of values 10..60 (and a constant image) at the model's size
    ramp = np.tile(np.linspace(10, 60, 32).astype(np.uint8)[None, :, None], (32, 1, 3))

    x = prepare_input(ramp, 32, "percentile")

    assert x.shape == (3, 32, 32) and x.dtype == np.float32
    assert x.min() == 0.0 and x.max() == 1.0
    np.testing.assert_array_equal(x[0], x[1])
    assert np.all(np.diff(x[0], axis=1) >= 0)  # the ramp keeps its order
    unit = prepare_input(ramp, 32, "unit")
    assert unit.max() == pytest.approx(60 / 255, abs=1e-6)  # "unit" keeps the dim values
    np.testing.assert_array_equal(prepare_input(np.full((8, 8, 3), 77, np.uint8), 32, "percentile"), 0.0)


def test_prepare_input_rejects_an_unknown_preprocessing():
    with pytest.raises(ValueError, match="'zscore' is unknown"):
        prepare_input(np.zeros((4, 4, 3), np.uint8), 32, "zscore")
