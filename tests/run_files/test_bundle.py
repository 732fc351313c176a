"""Tests of the model files: the super-model bundle and single (global) models."""

from __future__ import annotations

import re

import pytest
import torch

from fedsm_core.algorithms.fedsm.super_model import SuperModel
from fedsm_core.models.amplitude import AmplitudeNormalized
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights
from fedsm_core.run_files.bundle import BUNDLE_FORMAT, BundleInfo, load_bundle, save_bundle, save_global_model
from fedsm_core.run_files.model_files import GLOBAL_MODEL_FORMAT, GlobalModelInfo, load_global_model

SPEC = ModelSpec(encoder="mobilenet_v2", num_structures=2, num_sites=2, selector_width=4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny super model with random weights, saved once for the module."""
    torch.manual_seed(0)
    global_model = SPEC.build_segmentation()
    personalized = [SPEC.build_segmentation() for _ in range(2)]
    selector = SPEC.build_selector()
    info = BundleInfo(
        spec=SPEC,
        site_names=("site-1", "site-2"),
        structures=("disc", "cup"),
        gamma=0.5,
        image_size=32,
        extra={"rounds": 3, "note": "test"},
    )
    path = save_bundle(
        tmp_path_factory.mktemp("bundle") / "nested" / "super_model.pt",
        info,
        get_weights(global_model),
        [get_weights(model) for model in personalized],
        get_weights(selector),
    )
    reference = SuperModel(global_model, personalized, selector, info.gamma).eval()
    return path, info, reference


def test_round_trip_gives_identical_outputs(trained):
    # Prepare
    path, info, reference = trained
    images = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))

    # Execute
    loaded, loaded_info = load_bundle(path)
    expected_logits, expected_routes, expected_probs = reference.forward_with_routes(images)
    logits, routes, probs = loaded.forward_with_routes(images)

    # Assert
    assert loaded_info == info
    assert not loaded.training
    assert loaded.gamma == 0.5
    assert len(loaded.personalized) == 2
    assert logits.shape == (1, 2, 32, 32)
    assert torch.equal(routes, expected_routes)
    assert torch.equal(probs, expected_probs)
    assert torch.equal(logits, expected_logits)
    for index in range(2):
        assert torch.equal(loaded.personalized[index](images), reference.personalized[index](images))
    assert torch.equal(loaded.global_model(images), reference.global_model(images))


def test_a_gamma_per_model_round_trips(tmp_path):
    info = BundleInfo(SPEC, ("site-1", "site-2"), ("disc", "cup"), (0.0, 1.0), 32, {})
    weights = get_weights(SPEC.build_segmentation())
    path = save_bundle(tmp_path / "b.pt", info, weights, [weights, weights], get_weights(SPEC.build_selector()))

    loaded, loaded_info = load_bundle(path)

    assert loaded_info.gamma == (0.0, 1.0) and loaded.gamma == (0.0, 1.0)
    # site 2's model is never used: with gamma 1 its images go to the global model
    assert loaded.routes(torch.tensor([[0.1, 0.9], [0.6, 0.4]])).tolist() == [-1, 0]


@pytest.mark.parametrize("route_by", ["image", "case"])
def test_route_by_round_trips(tmp_path, route_by):
    # Prepare
    info = BundleInfo(SPEC, ("site-1", "site-2"), ("disc", "cup"), 0.5, 32, {}, route_by=route_by)
    weights = get_weights(SPEC.build_segmentation())

    # Execute
    path = save_bundle(tmp_path / "b.pt", info, weights, [weights, weights], get_weights(SPEC.build_selector()))
    _, loaded_info = load_bundle(path)

    # Assert
    assert torch.load(path, weights_only=True)["route_by"] == route_by
    assert loaded_info.route_by == route_by and loaded_info == info


def test_a_bundle_saved_before_route_by_was_recorded_loads_as_routing_per_image(trained, tmp_path):
    # Prepare: the payload of an older server, which had no "route_by" entry
    path, info, _ = trained
    payload = torch.load(path, weights_only=True)
    del payload["route_by"]
    old = tmp_path / "old_super_model.pt"
    torch.save(payload, old)

    # Execute
    loaded, loaded_info = load_bundle(old)

    # Assert: routed per image (the paper's rule), everything else as saved
    assert loaded_info.route_by == "image"
    assert loaded_info == info and len(loaded.personalized) == 2


def test_an_unknown_route_by_is_refused_naming_the_file_or_the_info(trained, tmp_path):
    # Prepare
    path, info, _ = trained
    payload = torch.load(path, weights_only=True)
    payload["route_by"] = "patient"
    damaged = tmp_path / "damaged.pt"
    torch.save(payload, damaged)

    # Execute / Assert
    with pytest.raises(ValueError, match=re.escape(f"bundle '{damaged}': route-by = 'patient' is not one of "
                                                   "['image', 'case']") + ".*pass the super_model.pt"):
        load_bundle(damaged)
    with pytest.raises(ValueError, match=re.escape("BundleInfo: route-by = 'slice' is not one of ['image', 'case']")):
        BundleInfo(SPEC, ("a", "b"), ("disc", "cup"), 0.5, 32, {}, route_by="slice")


def test_save_leaves_no_temporary_file(trained):
    # Prepare
    path, _, _ = trained

    # Execute
    names = sorted(p.name for p in path.parent.iterdir())

    # Assert
    assert names == ["super_model.pt"]


def test_payload_is_weights_only_loadable(trained):
    # Prepare
    path, _, _ = trained

    # Execute
    payload = torch.load(path, map_location="cpu", weights_only=True)

    # Assert
    assert payload["format"] == BUNDLE_FORMAT
    assert payload["site_names"] == ["site-1", "site-2"]
    assert len(payload["personalized"]) == 2


def test_wrong_number_of_personalized_models_raises(tmp_path):
    # Prepare
    info = BundleInfo(SPEC, ("a", "b"), ("disc", "cup"), 0.5, 32, {})

    # Execute / Assert
    with pytest.raises(ValueError, match="1 personalized models for 2 sites"):
        save_bundle(tmp_path / "b.pt", info, {}, [{}], {})


def test_truncated_file_raises_value_error_with_path(trained, tmp_path):
    # Prepare
    path, _, _ = trained
    truncated = tmp_path / "truncated.pt"
    data = path.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])

    # Execute / Assert
    with pytest.raises(ValueError, match=re.escape(str(truncated))):
        load_bundle(truncated)


def test_garbage_file_raises_value_error_with_path(tmp_path):
    # Prepare
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a torch file at all\x00\x01\x02")

    # Execute / Assert
    with pytest.raises(ValueError, match=re.escape(str(garbage)) + ".*not a readable FedSM bundle"):
        load_bundle(garbage)


def test_missing_file_raises_file_not_found(tmp_path):
    # Prepare
    missing = tmp_path / "nowhere" / "super_model.pt"

    # Execute / Assert
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_bundle(missing)


def test_directory_is_not_a_bundle(tmp_path):
    # Prepare / Execute / Assert
    with pytest.raises(IsADirectoryError, match="is a folder, not a model file"):
        load_bundle(tmp_path)


@pytest.mark.parametrize("payload", [{"weights": torch.zeros(2)}, {"format": "something-else/1"}, [1, 2, 3]])
def test_other_torch_file_raises_value_error_mentioning_format(tmp_path, payload):
    # Prepare
    other = tmp_path / "other.pt"
    torch.save(payload, other)

    # Execute / Assert
    with pytest.raises(ValueError, match=re.escape(str(other)) + ".*format"):
        load_bundle(other)


# ---------------------------------------------------------------- single (global) models

AMPLITUDE_SPEC = ModelSpec("mobilenet_v2", 2, 2, 4, amplitude_size=32)


@pytest.fixture(scope="module")
def harmofl_model(tmp_path_factory):
    """A HarmoFL-style model: amplitude normalization in front, its global amplitude frozen."""
    torch.manual_seed(0)
    model = AMPLITUDE_SPEC.build_segmentation().eval()
    model.amplitude_norm.freeze(torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(2)) * 50)
    path = save_global_model(tmp_path_factory.mktemp("harmofl") / "global_model.pt", AMPLITUDE_SPEC,
                             ("disc", "cup"), 32, get_weights(model), {"strategy": "harmofl"})
    return path, model


def test_amplitude_normalized_global_model_round_trips_and_predicts(harmofl_model):
    # Prepare
    path, reference = harmofl_model
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))

    # Execute
    loaded, info = load_global_model(path)

    # Assert
    assert info == GlobalModelInfo(AMPLITUDE_SPEC, ("disc", "cup"), 32, {"strategy": "harmofl"})
    assert isinstance(loaded, AmplitudeNormalized) and not loaded.training
    assert int(loaded.amplitude_norm.frozen) == 1
    assert torch.equal(loaded.amplitude_norm.amplitude, reference.amplitude_norm.amplitude)
    with torch.no_grad():
        logits = loaded(images)
        assert logits.shape == (2, 2, 32, 32)
        assert torch.equal(logits, reference(images))
        # the frozen amplitude is used: a plain U-Net with the same weights answers differently
        assert not torch.equal(logits, loaded.net(images))


def test_a_bundle_is_not_a_global_model_and_the_other_way_round(trained, harmofl_model):
    # Prepare
    bundle_path, _, _ = trained
    global_path, _ = harmofl_model

    # Execute / Assert
    with pytest.raises(ValueError, match=re.escape(f"'{bundle_path}' is not a FedSM global model: format "
                                                   f"'{BUNDLE_FORMAT}', expected '{GLOBAL_MODEL_FORMAT}'")
                       + ".*global_model.pt"):
        load_global_model(bundle_path)
    with pytest.raises(ValueError, match=re.escape(f"format '{GLOBAL_MODEL_FORMAT}', expected '{BUNDLE_FORMAT}'")
                       + ".*pass the super_model.pt"):
        load_bundle(global_path)


def test_a_missing_or_unreadable_global_model_names_the_file(tmp_path):
    # Prepare
    missing = tmp_path / "nowhere" / "global_model.pt"
    garbage = tmp_path / "global_model.pt"
    garbage.write_bytes(b"this is not a torch file at all\x00\x01\x02")

    # Execute / Assert
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing)) + ".*site_models/<site>.pt"):
        load_global_model(missing)
    with pytest.raises(ValueError, match=re.escape(str(garbage)) + ".*not a readable FedSM global model"):
        load_global_model(garbage)
