"""``fedsm predict`` never destroys or mixes data: --out checks, --overwrite, --batch-size, --model."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedsm_core.command_line.cli import main
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.run_files.bundle import save_global_model

SPEC = ModelSpec("mobilenet_v2", 2, 2, 8)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    """A small random global_model.pt (what it draws does not matter here)."""
    torch.manual_seed(0)
    return save_global_model(tmp_path_factory.mktemp("model") / "global_model.pt", SPEC, ("disc", "cup"), 32,
                             get_weights(SPEC.build_segmentation()), {"preprocessing": "unit"})


def image_folder(folder: Path, *stems: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(stems))
    for stem in stems:
        Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(folder / f"{stem}.png")
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def predict(model: Path, images: Path, out: Path, *extra: str) -> int:
    return main(["predict", "--model", str(model), "--images", str(images), "--out", str(out), "--device", "cpu",
                 *extra])


@pytest.mark.parametrize("where", ["same", "inside", "contains"])
def test_an_out_folder_that_is_in_or_around_the_images_is_refused_and_nothing_changes(
        model_file, tmp_path, capsys, where):
    # Prepare
    images = image_folder(tmp_path / "data" / "images", "a", "b")
    out = {"same": images, "inside": images / "masks", "contains": tmp_path / "data"}[where]
    before = snapshot(tmp_path)

    # Execute
    status = predict(model_file, images, out)

    # Assert
    err = capsys.readouterr().err
    assert status == 1
    assert f"--out {out}" in err and "pass an --out folder outside" in err
    assert snapshot(tmp_path) == before


def test_a_second_run_into_the_same_out_is_refused_without_overwrite(model_file, tmp_path, capsys):
    # Prepare
    images = image_folder(tmp_path / "images", "a", "b")
    out = tmp_path / "out"
    assert predict(model_file, images, out) == 0
    before = snapshot(out)

    # Execute
    status = predict(model_file, images, out)

    # Assert
    err = capsys.readouterr().err
    assert status == 1
    assert "earlier run" in err and "--overwrite" in err
    assert snapshot(out) == before


def test_overwrite_removes_the_masks_of_the_earlier_table_first(model_file, tmp_path):
    # Prepare: the first run wrote a.png and b.png; the second folder holds c only
    out = tmp_path / "out"
    assert predict(model_file, image_folder(tmp_path / "first", "a", "b"), out) == 0
    (out / "notes.txt").write_text("the user's own file")

    # Execute
    status = predict(model_file, image_folder(tmp_path / "second", "c"), out, "--overwrite")

    # Assert: no stale mask is left that the new table does not list; other files stay
    assert status == 0
    assert sorted(p.name for p in out.iterdir()) == ["c.png", "notes.txt", "predictions.csv"]
    with (out / "predictions.csv").open(newline="") as handle:
        assert [row["mask"] for row in csv.DictReader(handle)] == ["c.png"]


def test_a_file_no_earlier_table_lists_is_never_replaced(model_file, tmp_path, capsys):
    # Prepare: out holds a.png of the user's own, no predictions.csv
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.png").write_bytes(b"user data")

    # Execute
    status = predict(model_file, image_folder(tmp_path / "images", "a"), out, "--overwrite")

    # Assert
    assert status == 1
    assert "['a.png']" in capsys.readouterr().err
    assert (out / "a.png").read_bytes() == b"user data"


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_batch_size_below_one_is_refused_by_the_parser(model_file, tmp_path, capsys, value):
    images = image_folder(tmp_path / "images", "a")

    with pytest.raises(SystemExit) as stopped:
        predict(model_file, images, tmp_path / "out", "--batch-size", value)

    assert stopped.value.code == 2
    assert "--batch-size" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_folder_given_as_model_is_called_a_folder(model_file, tmp_path, capsys):
    # Prepare: the run folder instead of the file in it
    run = tmp_path / "run"
    (run / "site_models").mkdir(parents=True)
    (run / "global_model.pt").write_bytes(model_file.read_bytes())

    # Execute
    status = predict(run, image_folder(tmp_path / "images", "a"), tmp_path / "out")

    # Assert
    err = capsys.readouterr().err
    assert status == 1
    assert f"'{run}' is a folder" in err and "global_model.pt" in err
    assert "does not exist" not in err
