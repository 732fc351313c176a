"""The real multi-site prostate samples (``../shared/data``) end to end: FedSM with per-case scores, then predict.

Six real MRI scanners, 3 train + 3 test slices each (``<case>_<slice>.png``,
``docs/data.md``), read in place through a federation spec in ``tmp_path``
(never copied, never written); the tests skip when the samples are absent (a
fresh clone). Too few images to segment well: the run checks the real
layout, the per-case scores and that the selector tells the scanners apart;
``fedsm predict`` then segments one real site's test folder with the run's
super model. One run (about 20 s on two busy cores) serves both.

Every site's ``train`` folder holds slices of a single patient (``00``), so
the loader refuses to split it into train and validation by patient (first
test). The spec therefore sets ``val-split = "file"``: validation is drawn
file by file while every id keeps its patient, so the test split is scored
per case.
"""

from __future__ import annotations

import csv
import hashlib
import os
import warnings
from pathlib import Path

import pytest
from PIL import Image
from support.in_process_grid import metrics_rows, only_run_folder, run_app

from fedsm_core.command_line.cli import main
from fedsm_core.data import png_layouts
from fedsm_core.data.files import DataError
from fedsm_core.inference.predict import CSV_COLUMNS

PROSTATE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multisite-samples" / "ProstateSlice"
SITES = ("BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL")
PATIENT = r"(\d+)_\d+"  # <case>_<slice>: the case (patient) of 00_01 is 00
RUN = ("num-server-rounds=2 max-local-steps=2 image-size=64 selector-width=8 eval-every=1 batch-size=2 "
       "route-by='case'")


def prostate_root() -> Path:
    """The real ProstateSlice samples, or a skip that names the folder expected."""
    if not PROSTATE.is_dir():
        pytest.skip(f"real multi-site prostate samples not found at {PROSTATE} (../shared/data beside the project)")
    return PROSTATE


def write_spec(folder: Path, root: Path) -> Path:
    """A federation spec in ``folder`` of the six real sites, each path relative to the spec's folder."""
    blocks = [f'[[sites]]\nname = "{site}"\nsource = "prostate-slices"\ncase-pattern = \'{PATIENT}\'\n'
              'val-split = "file"\n'
              f'path = "{Path(os.path.relpath(root / site, folder)).as_posix()}"\n'
              + ('on-orphans = "skip"\n' if site == "I2CVB" else "") for site in SITES]
    spec = folder / "real-prostate.toml"
    spec.write_text('name = "real-prostate"\n\n' + "\n".join(blocks))
    return spec


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """One 2-round FedSM run on the six real sites: its folder, its metrics rows and the warnings it gave."""
    root = prostate_root()
    work = tmp_path_factory.mktemp("real-prostate")
    spec = write_spec(work, root)
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.setenv("FEDSM_SITE_STATE", str(work / "site-state"))
        run_app(work / "runs", f"{RUN} dataset='{spec}'", num_nodes=len(SITES))
    folder = only_run_folder(work / "runs")
    return folder, metrics_rows(folder), [str(w.message) for w in caught]


def test_a_split_by_patient_of_a_one_patient_train_folder_is_refused_naming_the_fix():
    # Prepare: BIDMC/train holds 00_00..00_02, all of patient 00
    site = prostate_root() / "BIDMC"

    # Execute / Assert: validation takes whole cases, so one case cannot be split
    with pytest.raises(DataError, match=r"holds 3 files of one case \('00'.*set val-split = \"file\""):
        png_layouts.load_png_site(site, "prostate-slices", 32, case_pattern=PATIENT)


def test_with_validation_drawn_by_file_every_id_names_its_patient():
    # Execute
    splits = png_layouts.load_png_site(prostate_root() / "BIDMC", "prostate-slices", 32, case_pattern=PATIENT,
                                       val_split="file")

    # Assert: 3 train slices 80/20 -> 2 train, 1 validation; test as given
    assert (len(splits.train.ids), len(splits.val.ids)) == (2, 1)
    assert splits.test.ids == ("BIDMC/00/00_00", "BIDMC/00/00_01", "BIDMC/00/00_02")
    assert all(i.startswith("BIDMC/00/") for i in splits.train.ids + splits.val.ids)


def test_fedsm_on_the_real_sites_scores_cases_and_tells_the_scanners_apart(real_run):
    # Execute: the module's run (real_run)
    folder, rows, caught = real_run

    # Assert: I2CVB's image without a mask and mask without an image are left out with a warning naming both
    train = prostate_root() / "I2CVB" / "train"
    orphans = [m for m in caught if "on-orphans" in m]
    assert len(orphans) >= 1 and all(str(train / "image" / "00_03.png") in m for m in orphans), caught
    assert all(str(train / "mask" / "00_00.png") in m for m in orphans)
    test = {(r["site"], r["metric"]): float(r["value"]) for r in rows if r["split"] == "test"}
    for site in SITES:  # one case a site: each test folder holds slices of patient 00
        patients = {p.stem.split("_")[0] for p in (prostate_root() / site / "test" / "image").glob("*.png")}
        assert test[(site, "num-cases")] == len(patients) == 1, site
        assert 0.0 <= test[(site, "case-dice-super")] <= 1.0, site
    assert test[("pooled", "num-cases")] == len(SITES)
    # Chance is 1/6. Routed per case, each test patient is one the selector never saw. Measured 0.667 (BIDMC, BMC,
    # I2CVB, RUNMC right; HK, UCL wrong; per slice the same selector gets 10 of 18); seeds 1 and 2: 0.5, 0.333
    assert test[("pooled", "selector-accuracy")] >= 0.3
    assert (folder / "super_model.pt").is_file()


def folder_state(folder: Path) -> dict[str, tuple[int, str]]:
    """Name -> (size, SHA-256) of every file under ``folder``."""
    return {str(p.relative_to(folder)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_predict_segments_a_real_sites_test_images_with_the_runs_super_model(real_run, tmp_path):
    # Prepare
    images = prostate_root() / "HK" / "test" / "image"
    before = folder_state(images)
    out = tmp_path / "masks"

    # Execute: 2-D images carry no case, so the case run's super model routes each alone (--route-by image)
    status = main(["predict", "--model", str(real_run[0] / "super_model.pt"), "--images", str(images),
                   "--out", str(out), "--device", "cpu", "--route-by", "image"])

    # Assert: one mask per input at the input's size, a row per image with its route; the input untouched
    assert status == 0
    with (out / "predictions.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        rows = list(reader)
    assert [r["image"] for r in rows] == sorted(before)
    for row in rows:
        with Image.open(images / row["image"]) as source, Image.open(out / row["mask"]) as mask:
            assert mask.size == source.size == (384, 384)
        assert row["model"] in ("global", *SITES) and row["most-likely-site"] in SITES
    assert sorted(p.name for p in out.iterdir()) == sorted([*before, "predictions.csv"])
    assert folder_state(images) == before
