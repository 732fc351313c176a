"""A whole run on slices that name their cases: per-case scores beside the slice Dice, routing per case.

The bundle the server saves records the run's ``route-by``, which ``fedsm predict`` follows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.in_process_grid import TINY

from fedsm_core.config import RunConfig
from fedsm_core.data.registry import training_dataset
from fedsm_core.data.statistics import channel_statistics
from fedsm_core.run_files.bundle import load_bundle
from server_app.discovery import SiteNode
from server_app.strategies.builder import Setup, build_strategy

pytestmark = pytest.mark.long_module(seconds=12)


def write_case_site(folder: Path, seed: int) -> None:
    """A ProstateSlice-layout site whose files are ``<case>_<slice>``: 3 training cases and 2 test cases of 2 slices."""
    rng = np.random.default_rng(seed)
    for split, cases in (("train", ("c0", "c1", "c2")), ("test", ("t0", "t1"))):
        for sub in ("image", "mask"):
            (folder / split / sub).mkdir(parents=True)
        for case in cases:
            centre = rng.integers(-4, 5, 2)
            for number in (1, 2):
                y, x = np.mgrid[:40, :40]
                gland = (y - 20 - centre[0]) ** 2 + (x - 20 - centre[1]) ** 2 < 64
                image = np.where(gland, 60, 170) + rng.integers(0, 30, (40, 40))
                name = f"{case}_{number:02d}.png"
                Image.fromarray(image.astype(np.uint8)).save(folder / split / "image" / name)
                Image.fromarray(np.where(gland, 0, 255).astype(np.uint8)).save(folder / split / "mask" / name)


def test_a_run_on_cases_reports_case_scores_and_labels_them(tmp_path, in_process_app):
    # Prepare: two sites of cases, a federation spec, routing per case
    for index, name in enumerate(("north", "south")):
        write_case_site(tmp_path / "data" / name, seed=index)
    spec = tmp_path / "federation.toml"
    spec.write_text("\n".join(f'[[sites]]\nname = "{n}"\nsource = "prostate-slices"\npath = "data/{n}"\n'
                              for n in ("north", "south")))

    # Execute: with kNN-Per at the test evaluation, on the global model and on the routed models
    folder, rows, _ = in_process_app(f"{TINY} dataset='{spec}' batch-size=2 route-by='case' knn-per=true "
                                     "knn-pixels-per-image=16", num_nodes=2)

    # Assert: two test cases a site, scored by every model; validation without the super model's case scores
    test = {(r["site"], r["metric"]): float(r["value"]) for r in rows if r["split"] == "test"}
    assert test[("north", "num-cases")] == 2.0 and test[("pooled", "num-cases")] == 4.0
    for model in ("global", "personal", "super", "knn-per", "super-knn"):
        assert 0.0 <= test[("pooled", f"case-dice-{model}")] <= 1.0
        assert ("pooled", f"num-missed-cases-{model}") in test
    assert not any(metric.startswith("case-hd95-mm-") for _, metric in test)  # PNG slices carry no spacing
    validation = {r["metric"] for r in rows if r["split"] == "val"}
    assert "case-dice-global" in validation and "case-dice-super" not in validation
    summary = (folder / "summary.md").read_text()
    assert "case-dice-super" in summary and "case-dice-knn-per" in summary
    assert "slice Dice (paper)" in summary and "per-case 3-D Dice" in summary
    assert "Per-case 3-D Dice" in (folder / "report.html").read_text()


@pytest.mark.parametrize(("strategy", "route_by"), [("fedsm", "case"), ("fedsm", "image"), ("fedsm-extra", "case")])
def test_the_saved_super_model_records_the_runs_route_by(tmp_path, strategy, route_by):
    # Prepare: the strategy's saver, straight after the start (no round needs to run to save a bundle)
    config = RunConfig.from_mapping({"strategy": strategy, "route-by": route_by, "image-size": 32,
                                     "selector-width": 4})
    info = training_dataset(config.dataset)
    pixels = channel_statistics(np.random.default_rng(0).random((1, 3, 4, 4)))
    nodes = [SiteNode(100 + index, index, name, 4, 2, 2, pixels) for index, name in enumerate(info.site_names)]
    setup = Setup(config, info, config.model_spec(len(info.structures), info.num_sites), nodes, lambda *args: None)
    _, save = build_strategy(setup)

    # Execute
    _, bundle = load_bundle(save(tmp_path))

    # Assert
    assert bundle.route_by == route_by
