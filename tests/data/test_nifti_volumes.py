"""Tests of the NIfTI prostate sources (multi-site and Decathlon layouts) on tiny volumes."""

from __future__ import annotations

import warnings
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from fedsm_core.data.doctor_report import format_reports
from fedsm_core.data.files import DataError
from fedsm_core.data.nifti_volumes import (
    inspect_nifti_site,
    load_nifti_site,
    split_cases,
    split_counts,
)

SHAPE = (24, 24, 6)
FOREGROUND_SLICES = (2, 3)
SIZE = 24  # same as the volumes: resizing is the identity, so targets compare exactly


def _save(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(array, np.eye(4)), str(path))
    return path


def _save_image(path: Path, volume: nib.Nifti1Image) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(volume, str(path))
    return path


def _box(k: int) -> tuple[slice, slice]:
    """The foreground box of case ``k``: its position differs per case, so a mix-up shows."""
    return slice(2 + 2 * k, 10 + 2 * k), slice(4, 12 + k)


def _label(k: int, shape=SHAPE, slices=FOREGROUND_SLICES, values=(1,)) -> np.ndarray:
    label = np.zeros(shape, np.uint8)
    rows, cols = _box(k)
    for z in slices:
        label[rows, cols, z] = values[0]
        if len(values) > 1:  # second value on the right half of the box (MSD zones)
            label[rows, (cols.start + cols.stop) // 2:cols.stop, z] = values[1]
    return label


def _image(label: np.ndarray) -> np.ndarray:
    """Bright box on a constant background (empty slices normalize to zeros)."""
    return np.where(label > 0, 100.0, 5.0).astype(np.float32)


def _multisite(site: Path, cases: dict[str, int], label_suffix="_segmentation", ext=".nii.gz", **kw) -> Path:
    for case, k in cases.items():
        label = _label(k, **kw)
        _save(site / f"{case}{ext}", _image(label))
        _save(site / f"{case}{label_suffix}{ext}", label)
    return site


def _msd(site: Path, cases: dict[str, int], channels=2, **kw) -> Path:
    for case, k in cases.items():
        label = _label(k, values=(1, 2), **kw)
        t2 = _image(label)
        adc = np.where(label > 0, 5.0, 100.0).astype(np.float32)  # dark box: the opposite of T2
        image = np.stack([t2, adc][:channels], axis=-1)
        _save(site / "imagesTr" / f"{case}.nii.gz", image)
        _save(site / "labelsTr" / f"{case}.nii.gz", label)
    return site


def _all(splits, field):
    return np.concatenate([getattr(getattr(splits, s), field) for s in ("train", "val", "test")])


def _ids(splits):
    return [i for s in ("train", "val", "test") for i in getattr(splits, s).ids]


def _case(example_id: str) -> str:
    return example_id.split("/")[1]


def _expected_mask(example_id: str, cases: dict[str, int]) -> np.ndarray:
    _, case, z = example_id.split("/")
    return (_label(cases[case])[:, :, int(z[1:])] > 0).astype(np.float32)


CASES = {"Case00": 0, "Case01": 1, "Case02": 2, "Case03": 3}


def test_multisite_slices_targets_and_ids(tmp_path):
    site = _multisite(tmp_path / "BIDMC", CASES)
    (site / "Case02_segmentation.nii.gz").rename(site / "Case02_Segmentation.nii.gz")  # some sites' spelling
    _multisite(site, {"Case04": 4}, ext=".nii")  # uncompressed files too
    cases = {**CASES, "Case04": 4}
    splits = load_nifti_site(site, SIZE, seed=0, empty_fraction=0.0)
    ids, images, masks = _ids(splits), _all(splits, "images"), _all(splits, "masks")
    assert sorted(ids) == sorted(f"BIDMC/{c}/z{z:03d}" for c in cases for z in FOREGROUND_SLICES)
    assert images.dtype == np.float32 and images.shape == (len(ids), 3, SIZE, SIZE)
    assert masks.dtype == np.float32 and masks.shape == (len(ids), 1, SIZE, SIZE)
    assert images.min() >= 0.0 and images.max() <= 1.0
    assert np.array_equal(images[:, 0], images[:, 1]) and np.array_equal(images[:, 0], images[:, 2])
    for example_id, image, mask in zip(ids, images, masks, strict=True):
        expected = _expected_mask(example_id, cases)
        assert np.array_equal(mask[0], expected), example_id  # the box of this case, not another's
        assert np.array_equal(image[0] > 0.5, expected > 0), example_id  # image and label of the same case


def test_resizing_keeps_the_box(tmp_path):
    site = _multisite(tmp_path / "UCL", {"Case00": 0})
    splits = load_nifti_site(site, 12, empty_fraction=0.0)
    assert splits.train.images.shape == (2, 3, 12, 12)
    expected = _label(0)[::2, ::2, 2] > 0  # a box on even rows/cols halves exactly
    assert np.array_equal(splits.train.masks[0, 0] > 0, expected)


def test_each_case_carries_its_header_spacing_scaled_to_the_resized_slices(tmp_path):
    # Prepare: one case with 0.5 x 0.8 mm pixels and 3 mm slices (24 x 24 voxels per slice), one with
    # 0.4 x 0.4 x 2.5 mm given in microns, one without a unit (read as mm)
    site = tmp_path / "RUNMC"
    label = _label(0)
    for name, zooms, unit in (("Case00", (0.5, 0.8, 3.0), "mm"), ("Case01", (400.0, 400.0, 2500.0), "micron"),
                              ("Case02", (1.0, 1.0, 4.0), "unknown")):
        for suffix, data in (("", _image(label)), ("_segmentation", label)):
            volume = nib.Nifti1Image(data, np.eye(4))
            volume.header.set_zooms(zooms)
            volume.header.set_xyzt_units(xyz=unit)
            _save_image(site / f"{name}{suffix}.nii.gz", volume)

    # Execute: slices resized from 24 to 12 pixels
    splits = load_nifti_site(site, 12, empty_fraction=0.0)

    # Assert: (dz, dy, dx) = (slice, row pixel * 24 / 12, column pixel * 24 / 12) mm, every case in each split
    expected = {"RUNMC/Case00": (3.0, 1.0, 1.6), "RUNMC/Case01": (2.5, 0.8, 0.8), "RUNMC/Case02": (4.0, 2.0, 2.0)}
    for split in (splits.train, splits.val, splits.test):
        assert {case for case in split.spacings} >= {"/".join(i.split("/")[:2]) for i in split.ids}
        for case, spacing in split.spacings.items():
            assert spacing == pytest.approx(expected[case]), case


def test_msd_zones_merge_and_modality_choice(tmp_path):
    cases = {"prostate_00": 0, "prostate_01": 1, "prostate_02": 2, "prostate_04": 3}
    site = _msd(tmp_path / "Task05_Prostate", cases)
    (site / "imagesTr" / "._prostate_00.nii.gz").write_bytes(b"macOS resource fork")
    (site / "labelsTr" / "._prostate_00.nii.gz").write_bytes(b"macOS resource fork")
    for modality, bright_box in ((0, True), (1, False)):
        splits = load_nifti_site(site, SIZE, layout="msd", modality=modality, empty_fraction=0.0, name="msd")
        ids = _ids(splits)
        assert sorted(ids) == sorted(f"msd/{c}/z{z:03d}" for c in cases for z in FOREGROUND_SLICES)
        for example_id, image, mask in zip(ids, _all(splits, "images"), _all(splits, "masks"), strict=True):
            box = _label(cases[_case(example_id)], values=(1, 2))[:, :, int(example_id[-3:])]
            assert set(np.unique(box)) == {0, 1, 2}  # both zones present ...
            assert np.array_equal(mask[0], (box > 0).astype(np.float32))  # ... and merged into one target
            assert np.array_equal(image[0] > 0.5, (box > 0) == bright_box), (modality, example_id)


def test_msd_three_d_images_and_missing_channel(tmp_path):
    site = _msd(tmp_path / "one-channel", {"prostate_00": 0, "prostate_01": 1}, channels=1)
    image = _save(site / "imagesTr" / "prostate_00.nii.gz", _image(_label(0)))  # 3-D: used as is
    splits = load_nifti_site(site, SIZE, layout="msd", empty_fraction=0.0)
    assert len(_ids(splits)) == 4
    with pytest.raises(DataError, match=r"prostate_01\.nii\.gz has 1 channel") as error:
        load_nifti_site(site, SIZE, layout="msd", modality=1, empty_fraction=0.0)
    assert str(image) not in str(error.value)


def test_split_is_by_patient_deterministic_and_listing_independent(tmp_path, monkeypatch):
    cases = {f"Case{i:02d}": i % 4 for i in range(8)}
    first = _multisite(tmp_path / "a" / "HK", cases)
    second = _multisite(tmp_path / "b" / "HK", dict(reversed(list(cases.items()))))  # created in reverse order
    splits = load_nifti_site(first, SIZE, seed=3)
    per_split = {s: {_case(i) for i in getattr(splits, s).ids} for s in ("train", "val", "test")}
    assert [len(per_split[s]) for s in ("train", "val", "test")] == [4, 2, 2]
    assert set().union(*per_split.values()) == set(cases)
    assert not (per_split["train"] & per_split["val"] or per_split["train"] & per_split["test"]
                or per_split["val"] & per_split["test"])
    reference = {s: getattr(splits, s).ids for s in ("train", "val", "test")}
    original_iterdir = Path.iterdir
    monkeypatch.setattr(Path, "iterdir", lambda self: iter(sorted(original_iterdir(self), reverse=True)))
    for folder in (first, second):
        again = load_nifti_site(folder, SIZE, seed=3)
        assert {s: getattr(again, s).ids for s in ("train", "val", "test")} == reference
    other_seed = load_nifti_site(first, SIZE, seed=4)
    assert {s: getattr(other_seed, s).ids for s in ("train", "val", "test")} != reference


def test_split_depends_on_site_name_and_small_sites():
    cases = [f"Case{i:02d}" for i in range(8)]
    assert split_cases(cases, 0, "HK") == split_cases(list(reversed(cases)), 0, "HK")
    assert len({str(split_cases(cases, 0, site)) for site in ("HK", "UCL", "BIDMC", "ISBI")}) > 1
    assert split_counts(1) == {"train": 1, "val": 0, "test": 0}
    assert split_counts(2) == {"train": 1, "val": 0, "test": 1}
    assert split_counts(3) == {"train": 1, "val": 1, "test": 1}
    assert split_counts(8) == {"train": 4, "val": 2, "test": 2}
    for n in range(1, 40):
        counts = split_counts(n)
        assert sum(counts.values()) == n and counts["train"] >= max(1, n // 2)
        assert abs(counts["val"] - n / 4) < 1 and abs(counts["test"] - n / 4) < 1


def test_single_case_site_goes_to_train(tmp_path):
    splits = load_nifti_site(_multisite(tmp_path / "tiny", {"Case00": 0}), SIZE, empty_fraction=0.0)
    assert len(splits.train) == 2 and len(splits.val) == 0 and len(splits.test) == 0
    assert splits.val.images.shape == (0, 3, SIZE, SIZE)


def test_empty_fraction(tmp_path):
    site = _multisite(tmp_path / "I2CVB", CASES, shape=(24, 24, 30), slices=(10, 11, 12))
    only_foreground = _ids(load_nifti_site(site, SIZE, empty_fraction=0.0))
    assert sorted(only_foreground) == sorted(f"I2CVB/{c}/z{z:03d}" for c in CASES for z in (10, 11, 12))
    everything = _ids(load_nifti_site(site, SIZE, empty_fraction=1.0))
    assert sorted(everything) == sorted(f"I2CVB/{c}/z{z:03d}" for c in CASES for z in range(30))
    half = _ids(load_nifti_site(site, SIZE, empty_fraction=0.5))
    assert set(only_foreground) < set(half) < set(everything)
    assert 0.3 < (len(half) - 12) / (len(everything) - 12) < 0.7
    assert half == _ids(load_nifti_site(site, SIZE, empty_fraction=0.5))  # seeded
    default = _ids(load_nifti_site(site, SIZE))  # 0.1 by default: a few empty slices
    assert set(only_foreground) < set(default) and len(default) < len(half)


@pytest.mark.parametrize("kwargs, message", [
    ({"layout": "nrrd"}, "layout"), ({"modality": -1}, "modality"), ({"empty_fraction": -0.1}, "empty_fraction"),
    ({"empty_fraction": 1.5}, "empty_fraction"), ({"on_orphans": "ignore"}, "on_orphans")])
def test_bad_options(tmp_path, kwargs, message):
    site = _multisite(tmp_path / "s", {"Case00": 0})
    with pytest.raises(ValueError, match=message) as error:
        load_nifti_site(site, SIZE, **kwargs)
    assert not isinstance(error.value, DataError)
    inspect_kwargs = {k: v for k, v in kwargs.items() if k in ("layout", "modality")}
    if inspect_kwargs:
        with pytest.raises(ValueError, match=message):
            inspect_nifti_site(site, **inspect_kwargs)


def _site_with_orphans(tmp_path) -> Path:
    site = _multisite(tmp_path / "ISBI", {"Case00": 0, "Case02": 2, "Case04": 3})
    _save(site / "Case01.nii.gz", _image(_label(1)))  # image without label, sorted between good cases
    _save(site / "Case09_segmentation.nii.gz", _label(1))  # label without image
    return site


def test_orphans_fail_lists_them(tmp_path):
    site = _site_with_orphans(tmp_path)
    with pytest.raises(DataError) as error:
        load_nifti_site(site, SIZE)
    message = str(error.value)
    assert "Case01.nii.gz (image without label" in message and "Case01_segmentation.nii.gz" in message
    assert "Case09_segmentation.nii.gz (label without image" in message
    assert "Case00" not in message


def test_orphans_skip_warns_and_loads_the_rest(tmp_path):
    site = _site_with_orphans(tmp_path)
    with pytest.warns(UserWarning, match="Case01.nii.gz") as caught:
        splits = load_nifti_site(site, SIZE, on_orphans="skip", empty_fraction=0.0)
    assert "Case09_segmentation.nii.gz" in str(caught[0].message)
    ids = _ids(splits)
    assert {_case(i) for i in ids} == {"Case00", "Case02", "Case04"}
    cases = {"Case00": 0, "Case02": 2, "Case04": 3}
    for example_id, mask in zip(ids, _all(splits, "masks"), strict=True):
        assert np.array_equal(mask[0], _expected_mask(example_id, cases)), example_id


def test_shape_mismatch_names_both_files(tmp_path):
    site = _multisite(tmp_path / "s", {"Case00": 0, "Case01": 1})
    _save(site / "Case01_segmentation.nii.gz", _label(1, shape=(24, 24, 5)))
    with pytest.raises(DataError, match="24x24x6") as error:
        load_nifti_site(site, SIZE)
    assert "Case01.nii.gz" in str(error.value) and "Case01_segmentation.nii.gz" in str(error.value)
    assert "24x24x5" in str(error.value)


def test_unexpected_label_values_name_the_file(tmp_path):
    site = _multisite(tmp_path / "s", {"Case00": 0, "Case01": 1})
    bad = _label(1)
    bad[0, 0, 0] = 7
    _save(site / "Case01_segmentation.nii.gz", bad)
    with pytest.raises(DataError, match=r"Case01_segmentation\.nii\.gz holds values \[7\]"):
        load_nifti_site(site, SIZE)
    fractional = _label(1).astype(np.float32)
    fractional[0, 0, 0] = 0.5
    _save(site / "Case01_segmentation.nii.gz", fractional)
    with pytest.raises(DataError, match=r"Case01_segmentation\.nii\.gz holds non-integer values \[0\.5\]"):
        load_nifti_site(site, SIZE)


@pytest.mark.parametrize("victim", ["Case01.nii.gz", "Case01_segmentation.nii.gz"])
def test_corrupt_files_name_the_file(tmp_path, victim):
    site = _multisite(tmp_path / "s", {"Case00": 0, "Case01": 1})
    (site / victim).write_bytes(b"\x00garbage, not a NIfTI file" * 40)
    with pytest.raises(DataError, match=f"cannot read .*{victim}"):
        load_nifti_site(site, SIZE)
    _multisite(site, {"Case01": 1})
    data = (site / victim).read_bytes()
    (site / victim).write_bytes(data[: len(data) // 2])  # header fine, data cut short
    with pytest.raises(DataError, match=f"cannot read .*{victim}"):
        load_nifti_site(site, SIZE)


def test_missing_folders(tmp_path):
    with pytest.raises(DataError, match="does not exist.*CaseNN_segmentation"):
        load_nifti_site(tmp_path / "nowhere", SIZE)
    site = _msd(tmp_path / "msd", {"prostate_00": 0})
    for path in (site / "labelsTr").iterdir():
        path.unlink()
    (site / "labelsTr").rmdir()
    with pytest.raises(DataError, match="labelsTr is missing.*imagesTr/prostate_NN"):
        load_nifti_site(site, SIZE, layout="msd")


def test_inspect_reports_everything_without_raising(tmp_path):
    site = _site_with_orphans(tmp_path)  # Case00, Case02, Case04 good; Case01 and Case09 orphans
    _multisite(site, {"Case05": 0}, shape=(24, 24, 8), slices=())  # usable, other size, empty label
    _multisite(site, {"Case06": 1})
    _save(site / "Case06_segmentation.nii.gz", _label(1, shape=(24, 24, 5)))  # shape mismatch
    _multisite(site, {"Case07": 1})
    _save(site / "Case07_segmentation.nii.gz", _label(1, values=(7,)))  # unexpected value
    _multisite(site, {"Case08": 1})
    (site / "Case08.nii.gz").write_bytes(b"garbage" * 50)  # unreadable
    report = inspect_nifti_site(site, name="ISBI")
    assert report.site == "ISBI" and not report.ok and [s.split for s in report.splits] == ["volumes"]
    volumes = report.splits[0]
    assert volumes.count == 4  # Case00, 02, 04, 05
    assert volumes.sizes == {"24x24x6": 5, "24x24x8": 1}  # Case08 unreadable
    assert volumes.mask_values == {0, 1, 7}
    assert volumes.empty_masks == [str(site / "Case05_segmentation.nii.gz")]
    assert len(volumes.orphans) == 2
    assert "Case01.nii.gz (image without label" in volumes.orphans[0]
    assert "Case09_segmentation.nii.gz (label without image" in volumes.orphans[1]
    assert len(volumes.errors) == 3
    assert "Case06.nii.gz is 24x24x6" in volumes.errors[0] and "24x24x5" in volumes.errors[0]
    assert "Case07_segmentation.nii.gz holds values [7]" in volumes.errors[1]
    assert "cannot read image volume" in volumes.errors[2] and "Case08.nii.gz" in volumes.errors[2]
    assert "ERRORS" in format_reports([report])


def test_inspect_clean_msd_site_and_missing_folders(tmp_path):
    site = _msd(tmp_path / "Task05", {"prostate_00": 0, "prostate_01": 1})
    report = inspect_nifti_site(site, layout="msd")
    volumes = report.splits[0]
    assert report.ok and volumes.count == 2 and volumes.sizes == {"24x24x6": 2}
    assert volumes.mask_values == {0, 1, 2} and not volumes.empty_masks
    too_few = inspect_nifti_site(site, layout="msd", modality=2).splits[0]
    assert too_few.count == 0 and len(too_few.errors) == 2 and "has 2 channel(s)" in too_few.errors[0]
    wrong_layout = inspect_nifti_site(site, layout="multisite")
    assert not wrong_layout.ok and "no NIfTI volumes" in wrong_layout.splits[0].errors[0]
    missing = inspect_nifti_site(tmp_path / "nowhere", layout="msd")
    assert not missing.ok and "does not exist" in missing.splits[0].errors[0]
    assert "imagesTr/prostate_NN" in missing.splits[0].errors[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the doctor reports orphans, it does not warn
        orphans = inspect_nifti_site(_site_with_orphans(tmp_path))
    assert len(orphans.splits[0].orphans) == 2 and orphans.splits[0].count == 3
