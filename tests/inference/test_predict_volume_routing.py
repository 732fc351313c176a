"""``fedsm predict`` routes a NIfTI volume once (``route-by = "case"``) or slice by slice (``"image"``).

The bundle's selector is replaced by :class:`ScriptedSelector`, whose
probabilities per slice are written below, so every route is derived by hand.
Its models draw a constant label: global 1 (disc), site-a 2 (cup over disc),
site-b 0 (nothing); a slice's labels name the model that segmented it.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image
from support.prostate_volumes import write_volume

from fedsm_core.command_line.cli import main
from fedsm_core.inference import predict
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.run_files.bundle import BundleInfo, save_bundle, save_global_model

SPEC = ModelSpec("mobilenet_v2", 2, 2, 8)
GAMMA = 0.55
A, B = (0.8, 0.2), (0.2, 0.8)  # a slice the selector gives to site-a, one it gives to site-b, both above gamma
# Selector probabilities of the slices, in the order predict reads them: Case00's six, then Case01's six.
CASE00 = [A, B, A, A, B, A]
CASE01 = [A, B, A, B, A, B]
MODEL_OF_LABEL = {1: "global", 2: "site-a", 0: "site-b"}


class ScriptedSelector(torch.nn.Module):
    """Returns ``log p`` of the next rows of ``table`` (so ``softmax`` gives back ``p``), one row per image seen."""

    def __init__(self, table: list[tuple[float, float]]) -> None:
        super().__init__()
        self.log_probs, self.seen = torch.tensor(table, dtype=torch.float32).log(), 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        rows = self.log_probs[self.seen:self.seen + len(images)]
        self.seen += len(images)
        return rows


def constant_unet(*present: bool) -> torch.nn.Module:
    """A U-Net predicting structure k everywhere (``present[k]``) or nowhere, whatever the slice."""
    model = SPEC.build_segmentation()
    head = model.segmentation_head[0]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([10.0 if p else -10.0 for p in present]))
    return model


def write_bundle(path: Path, route_by: str) -> Path:
    """A super model of sites ``site-a``, ``site-b`` with gamma 0.55 and the given ``route-by``."""
    info = BundleInfo(SPEC, ("site-a", "site-b"), ("disc", "cup"), GAMMA, 32, {"preprocessing": "percentile"},
                      route_by=route_by)
    personalized = [get_weights(constant_unet(True, True)), get_weights(constant_unet(False, False))]
    return save_bundle(path, info, get_weights(constant_unet(True, False)), personalized,
                       get_weights(SPEC.build_selector()))


@pytest.fixture()
def scripted(monkeypatch):
    """Every bundle predict loads gets the :class:`ScriptedSelector` of Case00 then Case01."""
    load = predict.bundle_from_payload

    def with_scripted_selector(*args, **kwargs):
        model, info = load(*args, **kwargs)
        model.selector = ScriptedSelector(CASE00 + CASE01)
        return model, info

    monkeypatch.setattr(predict, "bundle_from_payload", with_scripted_selector)


@pytest.fixture()
def volumes(tmp_path) -> Path:
    """``Case00.nii.gz`` and ``Case01.nii.gz``: six 40 x 40 slices of noise each."""
    for index in range(2):
        data = np.random.default_rng(index).random((40, 40, 6)).astype(np.float32)
        write_volume(tmp_path / "volumes" / f"Case0{index}.nii.gz", data)
    return tmp_path / "volumes"


def run_predict(bundle: Path, images: Path, out: Path, *options: str) -> list[dict[str, str]]:
    """``fedsm predict`` (batches of 4 slices); the table's rows, each with ``routed``: its slices' models."""
    assert main(["predict", "--model", str(bundle), "--images", str(images), "--out", str(out),
                 "--device", "cpu", "--batch-size", "4", *options]) == 0
    with (out / "predictions.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        labels = np.asanyarray(nib.load(out / row["mask"]).dataobj)
        row["routed"] = [MODEL_OF_LABEL[int(labels[0, 0, z])] for z in range(labels.shape[2])]
        assert all(len(np.unique(labels[:, :, z])) == 1 for z in range(labels.shape[2]))
    return rows


@pytest.mark.parametrize(("saved", "options"), [("case", ()), ("image", ("--route-by", "case"))],
                         ids=["the-bundle's-route-by", "--route-by-case"])
def test_routing_per_case_sends_every_slice_of_a_volume_to_one_model(scripted, volumes, tmp_path, saved, options):
    # Prepare
    bundle = write_bundle(tmp_path / "super_model.pt", saved)

    # Execute
    case00, case01 = run_predict(bundle, volumes, tmp_path / "out", *options)

    # Assert: p_c = softmax of the mean log-probability over the case's slices.
    # Case00: 4 slices A, 2 slices B: mean log(p_a / p_b) = (4 ln 4 - 2 ln 4) / 6 = ln 4 / 3, so
    # p_a / p_b = 4^(1/3) = 1.5874 and p_a = 1.5874 / 2.5874 = 0.6135 > gamma 0.55: site-a for all six
    expected_a = 4 ** (1 / 3) / (1 + 4 ** (1 / 3))
    assert math.isclose(expected_a, 0.6135, abs_tol=1e-4)
    assert case00["routed"] == ["site-a"] * 6
    assert (case00["model"], case00["routes"], case00["selector-confidence"], case00["most-likely-site"]) == (
        "site-a", "site-a=1.0000", "0.6135", "site-a")
    # Case01: 3 A, 3 B: the means are equal, p_c = (0.5, 0.5), 0.5 <= gamma: the global model for all six
    assert case01["routed"] == ["global"] * 6
    assert (case01["model"], case01["routes"], case01["selector-confidence"]) == ("global", "global=1.0000", "0.5000")


@pytest.mark.parametrize(("saved", "options"), [("image", ()), ("case", ("--route-by", "image"))],
                         ids=["the-bundle's-route-by", "--route-by-image"])
def test_routing_per_image_sends_each_slice_to_its_own_model(scripted, volumes, tmp_path, saved, options):
    # Prepare
    bundle = write_bundle(tmp_path / "super_model.pt", saved)

    # Execute
    case00, case01 = run_predict(bundle, volumes, tmp_path / "out", *options)

    # Assert: max(p) = 0.8 > 0.55 on every slice, so A goes to site-a and B to site-b, slice by slice
    assert case00["routed"] == ["site-a", "site-b", "site-a", "site-a", "site-b", "site-a"]
    assert (case00["model"], case00["routes"], case00["selector-confidence"]) == (
        "site-a", "site-a=0.6667;site-b=0.3333", "0.8000")
    assert case01["routed"] == ["site-a", "site-b"] * 3
    # a tie of 3 and 3: the earliest slice's route names the volume
    assert (case01["model"], case01["routes"]) == ("site-a", "site-a=0.5000;site-b=0.5000")


# ---------------------------------------------------------------- 2-D images and single models

@pytest.fixture()
def images(tmp_path) -> Path:
    """Two 2-D images: ``a.png``, ``b.png``."""
    folder = tmp_path / "images"
    folder.mkdir()
    for index, name in enumerate(("a.png", "b.png")):
        pixels = np.random.default_rng(index).integers(0, 256, (20, 30, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / name)
    return folder


def test_route_by_case_is_refused_for_2d_images_which_carry_no_case(scripted, images, tmp_path, capsys):
    # Prepare
    bundle = write_bundle(tmp_path / "super_model.pt", "image")

    # Execute
    status = main(["predict", "--model", str(bundle), "--images", str(images), "--out", str(tmp_path / "out"),
                   "--device", "cpu", "--route-by", "case"])

    # Assert
    assert status == 1
    error = capsys.readouterr().err
    assert "--route-by case routes once per case" in error and "2-D images, which carry no case" in error
    assert "drop --route-by case (or pass --route-by image)" in error
    assert not (tmp_path / "out" / "predictions.csv").exists()


def test_a_case_bundle_routes_2d_images_one_by_one_with_a_warning(scripted, images, tmp_path):
    # Prepare: the selector says A for a.png (site-a) and B for b.png (site-b)
    bundle = write_bundle(tmp_path / "super_model.pt", "case")

    # Execute
    with pytest.warns(UserWarning, match="route-by = \"case\".*carry no case: each image is routed alone"):
        predict.predict_folder(bundle, images, tmp_path / "out")

    # Assert
    with (tmp_path / "out" / "predictions.csv").open(newline="") as handle:
        assert [row["model"] for row in csv.DictReader(handle)] == ["site-a", "site-b"]


def test_route_by_is_refused_for_a_single_model(volumes, tmp_path):
    # Prepare
    model = save_global_model(tmp_path / "global_model.pt", SPEC, ("disc", "cup"), 32,
                              get_weights(constant_unet(True, False)))

    # Execute / Assert
    with pytest.raises(ValueError, match="--route-by case: route-by applies to super models only.*drop --route-by"):
        predict.predict_folder(model, volumes, tmp_path / "out", route_by="case")
