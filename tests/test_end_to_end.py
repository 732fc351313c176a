"""End to end: the README's run script, two FedSM rounds of `flwr run .` on tiny images."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedsm_core.algorithms.fedsm.gamma import describe_gamma
from fedsm_core.bundle import load_bundle

ROOT = Path(__file__).resolve().parents[1]
SELECTOR_ACCURACY_FLOOR = 0.9  # what a fitted head reaches on the tiny generated sites; chance is 1/6
# Pooled test Dice of the super model after the two tiny rounds: the untrained U-Net scores 0.088 on these
# images, the two rounds reach 0.145 with these seeds (the in-process loop, which equals the app bit for bit).
DICE_FLOOR = 0.12
TINY = "num-server-rounds=2 max-local-steps=2 image-size=32 data-scale=0.1 selector-width=8 eval-every=1"


def _run(tmp_path: Path, overrides: str, **extra_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home"), "FEDSM_RUNS": str(tmp_path / "runs"), **extra_env}
    # Ports of our own, so a SuperLink the user already runs is never used or disturbed.
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = extra_env.get("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "39291")
    env["FLWR_LOCAL_CONTROL_API_PORT"] = extra_env.get("FLWR_LOCAL_CONTROL_API_PORT", "39293")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "run-simulation.sh"), overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )


def _superlinks(flwr_home: Path) -> str:
    found = subprocess.run(["pgrep", "-af", f"--database {flwr_home}"], capture_output=True, text=True)
    return found.stdout.strip()


def _finished_run(tmp_path: Path, result: subprocess.CompletedProcess) -> tuple[Path, list[dict[str, str]]]:
    """Check the run succeeded and wrote one run folder; return it and its metrics rows."""
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (folder,) = list((tmp_path / "runs").iterdir())
    with (folder / "metrics.csv").open() as handle:
        return folder, list(csv.DictReader(handle))


def test_two_round_simulation_writes_metrics_summary_and_a_loadable_super_model(tmp_path):
    # Execute
    result = _run(tmp_path, TINY)

    # Assert
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    folders = list((tmp_path / "runs").iterdir())
    assert len(folders) == 1
    folder = folders[0]
    with (folder / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    val_rounds = {int(r["round"]) for r in rows if r["split"] == "val"}
    assert val_rounds == {1, 2}
    test_sites = {r["site"] for r in rows if r["split"] == "test" and r["metric"] == "dice-super"}
    assert test_sites == {f"site-{i}" for i in range(1, 7)} | {"pooled"}
    assert all(0.0 <= float(r["value"]) <= 1.0 for r in rows if r["metric"].startswith("dice"))
    # The selector tells the six sites apart after two rounds (chance: 1/6): its head is fitted from
    # every site's embedding statistics, so this holds although each site trains only on its own label.
    pooled_test = {r["metric"]: float(r["value"]) for r in rows if r["split"] == "test" and r["site"] == "pooled"}
    assert pooled_test["selector-accuracy"] >= SELECTOR_ACCURACY_FLOOR, pooled_test
    assert pooled_test["dice-super"] >= DICE_FLOOR, pooled_test  # it learned, not just ran
    # One gamma everywhere: the test ran at the gamma the last validation round chose and reported
    last_val = {r["metric"]: float(r["value"]) for r in rows if r["split"] == "val" and r["site"] == "pooled"
                and int(r["round"]) == 2}
    assert pooled_test["gamma"] == last_val["gamma"]
    summary = (folder / "summary.md").read_text()
    assert "| pooled |" in summary and "dice-super" in summary
    assert "gamma chosen on validation" in summary
    super_model, info = load_bundle(folder / "super_model.pt")
    assert f"gamma chosen on validation: {describe_gamma(info.gamma, info.site_names)}" in summary
    assert info.site_names == tuple(f"site-{i}" for i in range(1, 7))
    assert super_model(torch.rand(2, 3, 32, 32)).shape == (2, 2, 32, 32)
    assert _superlinks(tmp_path / "flwr-home") == ""


def test_a_failing_run_exits_non_zero(tmp_path):
    # image-size passes Flower's checks but fails RunConfig's (not a multiple of 32).
    result = _run(tmp_path, "num-server-rounds=1 image-size=48")

    assert result.returncode != 0
    assert "image-size = 48" in result.stdout + result.stderr
    assert _superlinks(tmp_path / "flwr-home") == ""


def test_scaffold_runs_through_the_same_app_and_saves_the_global_model(tmp_path):
    # Execute: two rounds, so the second uses control variates kept on the nodes
    result = _run(tmp_path, TINY + ' strategy="scaffold"')

    # Assert
    folder, rows = _finished_run(tmp_path, result)
    assert "SCAFFOLD" in result.stdout
    assert {r["metric"] for r in rows} == {"dice-global", "num-images", "num-empty"}
    assert {int(r["round"]) for r in rows if r["split"] == "val"} == {1, 2}
    assert (folder / "global_model.pt").exists() and not (folder / "super_model.pt").exists()
    assert "missed" not in (folder / "summary.md").read_text()


def test_fedsm_extra_trains_models_then_its_selector_and_saves_a_loadable_bundle(tmp_path):
    # Execute: 2 model rounds, then 1 selector round
    result = _run(tmp_path, TINY + ' strategy="fedsm-extra" extra-rounds=1')

    # Assert
    folder, rows = _finished_run(tmp_path, result)
    assert "round 3 (extra)" in result.stdout
    assert {int(r["round"]) for r in rows if r["split"] == "val"} == {1, 2, 3}
    super_model, info = load_bundle(folder / "super_model.pt")
    assert super_model.selector_includes_global
    assert super_model.selector(torch.rand(1, 3, 32, 32)).shape == (1, 7)


def _write_slice_site(folder: Path, seed: int) -> None:
    """A tiny ProstateSlice-layout site: grey images with a dark gland, inverted masks."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", 4), ("test", 2)):
        for sub in ("image", "mask"):
            (folder / split / sub).mkdir(parents=True)
        for i in range(count):
            y, x = np.mgrid[:40, :40]
            gland = (y - 20 - rng.integers(-4, 5)) ** 2 + (x - 20 - rng.integers(-4, 5)) ** 2 < 64
            image = np.where(gland, 60, 170) + rng.integers(0, 30, (40, 40))
            Image.fromarray(image.astype(np.uint8)).save(folder / split / "image" / f"s{i:02d}.png")
            Image.fromarray(np.where(gland, 0, 255).astype(np.uint8)).save(folder / split / "mask" / f"s{i:02d}.png")


def test_a_federation_spec_of_png_sites_runs_through_flwr(tmp_path):
    # Arrange: two sites in the ProstateSlice layout and a spec with relative paths
    for index, name in enumerate(("north", "south")):
        _write_slice_site(tmp_path / "data" / name, seed=index)
    spec = tmp_path / "federation.toml"
    spec.write_text("\n".join(f'[[sites]]\nname = "{n}"\nsource = "prostate-slices"\npath = "data/{n}"\n'
                              for n in ("north", "south")))

    # Execute
    result = _run(tmp_path, f"{TINY} dataset='{spec}' batch-size=2", NUM_SUPERNODES="2")

    # Assert
    folder, rows = _finished_run(tmp_path, result)
    assert folder.name.endswith("-fedsm-federation")
    assert {r["site"] for r in rows if r["split"] == "test"} == {"north", "south", "pooled"}
    _, info = load_bundle(folder / "super_model.pt")
    assert info.site_names == ("north", "south")


def test_fedbn_with_harmofl_components_and_knn_per_runs_through_flwr(tmp_path):
    # Execute: round 1 fixes the global amplitude, round 2 trains with it; kNN-Per at the test evaluation
    result = _run(tmp_path, TINY + ' strategy="fedbn" amplitude-normalization=true weight-perturbation=true'
                  ' knn-per=true knn-pixels-per-image=16')

    # Assert
    folder, rows = _finished_run(tmp_path, result)
    assert "FedBN" in result.stdout and "merged into the global amplitude" in result.stdout
    knn = [r for r in rows if r["split"] == "test" and r["metric"] == "dice-knn-per"]
    assert {r["site"] for r in knn} >= {f"site-{i}" for i in range(1, 7)}
    assert all(0.0 <= float(r["value"]) <= 1.0 for r in knn)
    assert not any(r["metric"] == "dice-knn-per" for r in rows if r["split"] == "val")
    saved = sorted(p.name for p in (folder / "site_models").iterdir())
    assert saved == [f"site-{i}.pt" for i in range(1, 7)]
    weights = [torch.load(folder / "site_models" / name, weights_only=True)["weights"] for name in saved]
    assert all(int(w["amplitude_norm.frozen"]) == 1 for w in weights)
    torch.testing.assert_close(weights[0]["amplitude_norm.amplitude"], weights[5]["amplitude_norm.amplitude"])


@pytest.mark.slow
def test_two_and_six_simulated_supernodes_give_the_same_metrics(tmp_path):
    # Execute: SCAFFOLD keeps a control variate per site between rounds; with 2 nodes each serves 3 sites
    results = {}
    for nodes in (2, 6):
        result = _run(tmp_path / f"nodes-{nodes}", TINY + ' strategy="scaffold"', NUM_SUPERNODES=str(nodes),
                      FLWR_LOCAL_SUPERLINK_HTTP_API_PORT="39491", FLWR_LOCAL_CONTROL_API_PORT="39493")
        results[nodes] = _finished_run(tmp_path / f"nodes-{nodes}", result)[1]

    # Assert
    assert len(results[2]) == len(results[6]) > 0
    assert results[2] == results[6]
    assert {r["site"] for r in results[2] if r["split"] == "test"} == {f"site-{i}" for i in range(1, 7)} | {"pooled"}
