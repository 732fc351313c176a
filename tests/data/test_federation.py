"""Federation specs: a TOML file of sites, their sources and data folders, loaded via dataset_info."""

from __future__ import annotations

import shutil

import pytest
from support.png_sites import prostate_folders, write_fundus_site, write_prostate_site

from fedsm_core.data import federation
from fedsm_core.data.federation import load_federation, locate_spec
from fedsm_core.data.registry import dataset_info

SIZE = 8


def _spec(path, *sites, name="tiny"):
    """Write a spec with one [[sites]] table per dict (values written as TOML strings)."""
    lines = [f'name = "{name}"', ""] if name else []
    for site in sites:
        lines.append("[[sites]]")
        lines += [f'{key} = "{value}"' for key, value in site.items()]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


@pytest.fixture
def layout(tmp_path):
    """Data under tmp/data (three prostate sites with distinct stems), spec folder tmp/specs."""
    data = tmp_path / "data"
    write_prostate_site(data / "A", train=("a", "b", "c"), test=("t1",))
    write_prostate_site(data / "B", train=("d", "e", "f"), test=("t2",))
    write_prostate_site(data / "other", train=("x1", "x2", "x3"), test=("t1", "t2"))
    return tmp_path


def _two_sites(tmp_path, **extra_b):
    return _spec(tmp_path / "specs" / "fed.toml",
                 {"name": "siteA", "source": "prostate-slices", "path": "../data/A"},
                 {"name": "siteB", "source": "prostate-slices", "path": "../data/B", **extra_b})


def _stems(arrays):
    return sorted(i.split("/", 1)[1] for i in arrays.ids)


def test_spec_gives_sites_in_spec_order_structures_and_loads_each_site(layout, monkeypatch):
    spec = _spec(layout / "specs" / "fed.toml",
                 {"name": "siteB", "source": "prostate-slices", "path": "../data/B"},
                 {"name": "siteA", "source": "prostate-slices", "path": "../data/A"})
    monkeypatch.chdir(layout / "data")  # relative paths must not depend on the working directory

    info = dataset_info(str(spec))

    assert info.site_names == ("siteB", "siteA")
    assert info.num_sites == 2
    assert info.structures == ("prostate",)
    first = info.load_site(0, SIZE, 0.5, 0)
    assert first.name == "siteB"
    assert sorted(_stems(first.train) + _stems(first.val)) == ["d", "e", "f"]
    assert first.test.ids == ("siteB/t2",)
    assert first.train.images.shape[1:] == (3, SIZE, SIZE)
    second = info.load_site(1, SIZE, 0.5, 0)
    assert second.name == "siteA"
    assert second.test.ids == ("siteA/t1",)


def test_relative_paths_resolve_against_the_spec_folder(layout, monkeypatch):
    spec_path = _two_sites(layout)
    monkeypatch.chdir(layout / "specs")

    spec = load_federation(spec_path.relative_to(layout / "specs"))

    assert [s.path for s in spec.sites] == [(layout / "data" / "A").resolve(), (layout / "data" / "B").resolve()]


def test_environment_variables_and_home_are_expanded(layout, monkeypatch):
    monkeypatch.setenv("FEDSM_TEST_DATA", str(layout / "data"))
    monkeypatch.setenv("HOME", str(layout))
    spec_path = _spec(layout / "specs" / "env.toml",
                      {"name": "siteA", "source": "prostate-slices", "path": "$FEDSM_TEST_DATA/A"},
                      {"name": "siteB", "source": "prostate-slices", "path": "~/data/B"})

    info = dataset_info(str(spec_path))

    assert load_federation(spec_path).sites[0].path == layout / "data" / "A"
    assert load_federation(spec_path).sites[1].path == layout / "data" / "B"
    assert info.load_site(0, SIZE, 0.5, 0).test.ids == ("siteA/t1",)


def test_a_data_path_overrides_one_sites_spec_path(layout):
    spec = _two_sites(layout)

    info = dataset_info(str(spec), data_paths={"siteB": str(layout / "data" / "other")})

    site_b = info.load_site(1, SIZE, 0.5, 0)
    assert site_b.name == "siteB"
    assert site_b.test.ids == ("siteB/t1", "siteB/t2")  # the stems of the other folder
    assert sorted(_stems(site_b.train) + _stems(site_b.val)) == ["x1", "x2", "x3"]
    assert info.load_site(0, SIZE, 0.5, 0).test.ids == ("siteA/t1",)  # siteA keeps its spec path


def test_data_path_for_an_unknown_site_is_an_error(layout):
    spec = _two_sites(layout)

    with pytest.raises(ValueError, match=r"\['siteC'\].*\['siteA', 'siteB'\]"):
        dataset_info(str(spec), data_paths={"siteC": str(layout / "data" / "other")})


def test_site_without_any_path_tells_how_to_set_the_data_path(layout):
    spec = _spec(layout / "specs" / "deploy.toml",
                 {"name": "siteA", "source": "prostate-slices"},
                 {"name": "siteB", "source": "prostate-slices"})

    info = dataset_info(str(spec), data_paths={"siteA": layout / "data" / "A"})

    assert info.load_site(0, SIZE, 0.5, 0).test.ids == ("siteA/t1",)
    with pytest.raises(ValueError) as caught:
        info.load_site(1, SIZE, 0.5, 0)
    message = str(caught.value)
    assert "'siteB' has no data path" in message
    assert "site-name='siteB' data-path=" in message


def test_site_options_reach_the_loader(layout):
    _, mask_dir = prostate_folders(layout / "data" / "B", "train")
    shutil.copy(mask_dir / "d.png", mask_dir / "orphan.png")
    strict = dataset_info(str(_two_sites(layout)))
    lenient = dataset_info(str(_spec(layout / "specs" / "skip.toml",
                                     {"name": "siteB", "source": "prostate-slices", "path": "../data/B",
                                      "on-orphans": "skip"})))

    with pytest.raises(ValueError, match=r"orphan\.png"):
        strict.load_site(1, SIZE, 0.5, 0)
    with pytest.warns(UserWarning, match=r"orphan\.png"):
        site = lenient.load_site(0, SIZE, 0.5, 0)
    assert sorted(_stems(site.train) + _stems(site.val)) == ["d", "e", "f"]


def test_fundus_spec_gives_disc_and_cup(tmp_path):
    write_fundus_site(tmp_path / "fundus" / "Site1", train=("a", "b"), test=("t1",))
    spec = _spec(tmp_path / "fundus.toml", {"name": "Site1", "source": "fundus-dofe", "path": "fundus/Site1"})

    info = dataset_info(str(spec))

    assert info.structures == ("disc", "cup")
    assert info.load_site(0, SIZE, 0.5, 0).test.masks.shape == (1, 2, SIZE, SIZE)


@pytest.mark.parametrize(
    ("sites", "pattern"),
    [
        ([{"name": "siteA", "source": "prostate-slices"}, {"name": "siteA", "source": "prostate-slices"}],
         r"site names \['siteA'\] appear more than once"),
        ([{"name": "siteA", "source": "prostate-jpeg"}],
         r"'prostate-jpeg' is unknown; known sources: \[.*'fundus-dofe'.*'prostate-slices'.*\]"),
        ([{"name": "siteA", "source": "prostate-slices", "colour-mode": "grey"}],
         r"site 'siteA': option\(s\) \['colour-mode'\].*"
         r"accepted: \['case-pattern', 'mask-encoding', 'on-orphans', 'val-split'\]"),
        ([{"name": "siteA", "source": "prostate-slices", "on-orphans": "ignore"}],
         r"site 'siteA': on-orphans = 'ignore' must be one of \['fail', 'skip'\]"),
        ([{"name": "siteA", "source": "prostate-slices", "mask-encoding": "rgb"}],
         r"site 'siteA': mask-encoding = 'rgb' must be one of"),
        ([{"name": "fundus", "source": "fundus-dofe"}, {"name": "prostate", "source": "prostate-slices"}],
         r"different targets"),
        ([{"source": "prostate-slices"}], r"site #1: 'name' is missing"),
        ([{"name": "siteA"}], r"site #1: 'source' is missing"),
    ],
    ids=["duplicate-names", "unknown-source", "unknown-option", "bad-on-orphans", "bad-encoding",
         "mixed-structures", "no-name", "no-source"],
)
def test_spec_errors_name_the_file_and_the_problem(tmp_path, sites, pattern):
    spec = _spec(tmp_path / "bad.toml", *sites)

    with pytest.raises(ValueError, match=pattern) as caught:
        dataset_info(str(spec))

    assert str(spec) in str(caught.value)
    assert "site" in str(caught.value)


def test_spec_without_sites_is_an_error(tmp_path):
    spec = _spec(tmp_path / "empty.toml", name="empty")

    with pytest.raises(ValueError, match=r"no \[\[sites\]\] tables"):
        load_federation(spec)


def test_unknown_top_level_key_is_an_error(tmp_path):
    spec = _spec(tmp_path / "typo.toml", {"name": "siteA", "source": "prostate-slices"})
    spec.write_text('site = "x"\n' + spec.read_text())

    with pytest.raises(ValueError, match=r"unknown top-level keys \['site'\]"):
        load_federation(spec)


def test_bad_toml_and_missing_file_are_errors_naming_the_file(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("[[sites]\nname = ")

    with pytest.raises(ValueError, match="broken.toml: cannot read it"):
        load_federation(broken)
    with pytest.raises(ValueError, match="missing.toml: cannot read it"):
        load_federation(tmp_path / "missing.toml")
    with pytest.raises(ValueError, match="missing.toml.*no federation spec found"):
        dataset_info(str(tmp_path / "missing.toml"))


def test_locate_spec_tries_the_working_directory_then_the_project_folder(tmp_path, monkeypatch):
    project = tmp_path / "project"
    work = tmp_path / "work"
    _spec(project / "feds" / "only-in-project.toml", {"name": "s", "source": "prostate-slices"})
    _spec(project / "feds" / "both.toml", {"name": "s", "source": "prostate-slices"})
    _spec(work / "feds" / "both.toml", {"name": "s", "source": "prostate-slices"})
    monkeypatch.setattr(federation, "PROJECT_ROOT", project)
    monkeypatch.chdir(work)

    assert locate_spec("feds/both.toml") == (work / "feds" / "both.toml").resolve()
    assert locate_spec("feds/only-in-project.toml") == (project / "feds" / "only-in-project.toml").resolve()
    assert locate_spec(str(project / "feds" / "both.toml")) == (project / "feds" / "both.toml").resolve()
    with pytest.raises(ValueError) as caught:
        locate_spec("feds/nowhere.toml")
    assert str(work / "feds" / "nowhere.toml") in str(caught.value)
    assert str(project / "feds" / "nowhere.toml") in str(caught.value)


def test_project_folder_is_the_repository_root():
    assert (federation.PROJECT_ROOT / "fedsm_core" / "data" / "federation.py").is_file()


def test_named_datasets_still_work_and_unknown_names_mention_specs():
    assert dataset_info("synthetic-fundus").structures == ("disc", "cup")
    with pytest.raises(ValueError, match=r"federation spec \(\*\.toml\)"):
        dataset_info("real-fundus")


def test_a_site_with_an_empty_split_is_refused_with_its_split_sizes():
    import numpy as np

    from fedsm_core.data.arrays import SegArrays, SiteSplits
    from fedsm_core.data.files import DataError
    from fedsm_core.data.registry import require_every_split

    def arrays(n):
        return SegArrays(np.zeros((n, 3, 8, 8), np.float32), np.zeros((n, 1, 8, 8), np.float32),
                         tuple(f"s/{i}" for i in range(n)))

    full = SiteSplits("s", arrays(2), arrays(1), arrays(1))
    assert require_every_split(full, "/data/s") is full
    with pytest.raises(DataError, match=r"no val images \(split sizes \{'train': 2, 'val': 0, 'test': 1\}\)"):
        require_every_split(SiteSplits("s", arrays(2), arrays(0), arrays(1)), "/data/s")
