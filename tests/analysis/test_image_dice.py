"""Per-image test Dice of a run folder's deployed model: its per-site means are what the ClientApp reports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedsm_core.analysis.image_dice import IMAGE_DICE_FILE, read_rows, run_sites, site_means, write_image_dice
from fedsm_core.config import RunConfig
from fedsm_core.evaluation.super_model_evaluation import evaluate_model, evaluate_super_model
from fedsm_core.models.weights import get_weights
from fedsm_core.run_files.bundle import BundleInfo, load_bundle, save_bundle, save_global_model
from fedsm_core.run_files.checkpoint import CHECKPOINT_FILE, save_checkpoint
from fedsm_core.run_files.model_files import load_global_model

STRUCTURES = ("disc", "cup")


def _run_folder(tmp_path: Path, strategy: str) -> tuple[Path, RunConfig]:
    """A finished run's files: its checkpoint (for the run config) and its model file(s), random weights."""
    torch.set_num_threads(1)
    config = RunConfig.from_mapping({"strategy": strategy, "image-size": 32, "data-scale": 0.05, "seed": 3,
                                     "data-seed": 2})
    spec = config.model_spec(len(STRUCTURES), 6)
    folder = tmp_path / strategy
    folder.mkdir()
    save_checkpoint(folder / CHECKPOINT_FILE, 1, config.to_mapping(), [f"site-{i}" for i in range(1, 7)],
                    strategy, {}, [])

    def weights(seed: int):
        torch.manual_seed(seed)
        return get_weights(spec.build_segmentation())

    if strategy == "fedavg":
        save_global_model(folder / "global_model.pt", spec, STRUCTURES, 32, weights(0))
    elif strategy == "fedbn":
        for i in range(1, 7):
            save_global_model(folder / "site_models" / f"site-{i}.pt", spec, STRUCTURES, 32, weights(i))
    else:
        info = BundleInfo(spec, tuple(f"site-{i}" for i in range(1, 7)), STRUCTURES, 0.2, 32, {})
        torch.manual_seed(9)
        save_bundle(folder / "super_model.pt", info, weights(0), [weights(i) for i in range(1, 7)],
                    get_weights(spec.build_selector()))
    return folder, config


def _reported(folder: Path, config: RunConfig) -> dict[str, float]:
    """What the ClientApp's evaluation reports per site (fedsm_core.evaluation.super_model_evaluation)."""
    sites = run_sites(config)
    if config.strategy == "fedsm":
        model, _ = load_bundle(folder / "super_model.pt")
        return {s.name: evaluate_super_model(model, i, s.test)["dice-super"] for i, s in enumerate(sites)}
    if config.strategy == "fedbn":
        return {s.name: evaluate_model(load_global_model(folder / "site_models" / f"{s.name}.pt")[0], s.test)[
            "dice-global"] for s in sites}
    model, _ = load_global_model(folder / "global_model.pt")
    return {s.name: evaluate_model(model, s.test)["dice-global"] for s in sites}


@pytest.mark.parametrize("strategy", ["fedavg", "fedbn", "fedsm"])
def test_per_site_means_of_the_image_file_equal_the_reported_dice(tmp_path, strategy):
    # Prepare
    folder, config = _run_folder(tmp_path, strategy)

    # Execute
    path = write_image_dice(folder)

    # Assert: one row per test image, with the site's data-seed split; means as the app reports them
    rows = read_rows(path)
    assert path == folder / IMAGE_DICE_FILE
    assert [r[1] for r in rows] == [i for s in run_sites(config) for i in s.test.ids]
    means, reported = site_means(rows), _reported(folder, config)
    assert means.keys() == reported.keys()
    for site, value in reported.items():
        assert means[site] == pytest.approx(value, abs=1e-9), site


def test_a_folder_without_a_checkpoint_says_which_file_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint.pt"):
        write_image_dice(tmp_path)
