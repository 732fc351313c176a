"""Datasets a run can name in ``dataset``: their sites, structures and loaders."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.federation import FederationSpec, load_federation, locate_spec
from fedsm_core.data.files import DataError
from fedsm_core.data.preprocess import DEFAULT_PREPROCESSING
from fedsm_core.data.sources import data_source
from fedsm_core.data.synthetic_copies import (
    MAX_SITES,
    PREFIX,
    STYLE_ONLY_DATASET,
    copy_site_name,
    fundus_site_count,
    generate_copy_site,
    generate_style_only_site,
)
from fedsm_core.data.synthetic_fundus import FUNDUS_SITES, generate_site
from fedsm_core.data.synthetic_prostate import PROSTATE_SITES
from fedsm_core.data.synthetic_prostate import generate_site as generate_prostate_site


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """Static description of a dataset.

    Attributes
    ----------
    site_names : tuple of str
        The sites, in the order of the selector's outputs.
    structures : tuple of str
        One name per output channel of the U-Net.
    load_site : callable
        ``load_site(site_index, image_size, scale, seed) -> SiteSplits``.
    preprocessing : str
        How image files map to model input, for ``fedsm predict``:
        ``"unit"`` (8-bit values / 255, the generated datasets) or
        ``"percentile"`` (the per-image window of the real sources).
    """

    site_names: tuple[str, ...]
    structures: tuple[str, ...]
    load_site: Callable[[int, int, float, int], SiteSplits]
    preprocessing: str = DEFAULT_PREPROCESSING

    @property
    def num_sites(self) -> int:
        """K, the number of sites."""
        return len(self.site_names)


def _synthetic_fundus() -> DatasetInfo:
    return DatasetInfo(
        site_names=tuple(site.name for site in FUNDUS_SITES),
        structures=("disc", "cup"),
        load_site=lambda index, size, scale, seed: generate_site(index, image_size=size, scale=scale, seed=seed),
    )


def _synthetic_fundus_style_only() -> DatasetInfo:
    return DatasetInfo(
        site_names=tuple(site.name for site in FUNDUS_SITES),
        structures=("disc", "cup"),
        load_site=lambda index, size, scale, seed: generate_style_only_site(index, size, scale, seed),
    )


def _synthetic_fundus_copies(count: int) -> DatasetInfo:
    return DatasetInfo(
        site_names=tuple(copy_site_name(index) for index in range(count)),
        structures=("disc", "cup"),
        load_site=lambda index, size, scale, seed: generate_copy_site(index, size, scale, seed),
    )


def _synthetic_prostate() -> DatasetInfo:
    return DatasetInfo(
        site_names=tuple(site.name for site in PROSTATE_SITES),
        structures=("prostate",),
        load_site=lambda index, size, scale, seed: generate_prostate_site(index, image_size=size, scale=scale,
                                                                          seed=seed),
    )


DATASETS: dict[str, Callable[[], DatasetInfo]] = {"synthetic-fundus": _synthetic_fundus,
                                                   STYLE_ONLY_DATASET: _synthetic_fundus_style_only,
                                                   "synthetic-prostate": _synthetic_prostate}


def require_every_split(site: SiteSplits, path: str | Path) -> SiteSplits:
    """``site`` unchanged if train, validation and test all hold images.

    Raises
    ------
    DataError
        Naming the site, its folder and the split sizes: every site trains,
        scores its models on validation (gamma, model choice) and reports test Dice.
    """
    sizes = {"train": len(site.train), "val": len(site.val), "test": len(site.test)}
    empty = [split for split, count in sizes.items() if count == 0]
    if empty:
        raise DataError(f"site '{site.name}' at {path} has no {'/'.join(empty)} images (split sizes {sizes}); "
                        "every site needs train, validation and test images: add data to this site")
    return site


def _federation(spec: FederationSpec, data_paths: Mapping[str, str | Path]) -> DatasetInfo:
    unknown = sorted(set(data_paths) - set(spec.site_names))
    if unknown:
        raise ValueError(f"data paths given for {unknown}, which are not sites of {spec.file} {list(spec.site_names)}")

    def load_site(index: int, size: int, scale: float, seed: int) -> SiteSplits:
        # Real sources ignore data-scale: they load every file, never a silent subset.
        site = spec.sites[index]
        path = data_paths.get(site.name, site.path)
        if path is None:
            raise ValueError(f"site '{site.name}' has no data path: set 'path' in {spec.file} or start its "
                             f"SuperNode with --node-config \"site-name='{site.name}' data-path='/your/data'\"")
        return require_every_split(data_source(site.source).load(Path(path), size, seed, site.options, site.name),
                                   path)

    return DatasetInfo(spec.site_names, spec.structures(), load_site, preprocessing="percentile")


def hold_out(info: DatasetInfo, site_name: str) -> DatasetInfo:
    """``info`` without the site ``site_name``: the federation that trains without it.

    The remaining sites keep their order and their own data; site index ``i``
    of the result loads the ``i``-th remaining site. An empty ``site_name``
    returns ``info`` unchanged.

    Raises
    ------
    ValueError
        For a name that is not a site, or when fewer than two sites would remain.
    """
    if not site_name:
        return info
    if site_name not in info.site_names:
        raise ValueError(f"held-out-site = '{site_name}' is not a site of the dataset {list(info.site_names)}")
    if info.num_sites < 3:
        raise ValueError(f"held-out-site = '{site_name}' would leave {info.num_sites - 1} site; "
                         "FedSM needs two or more")
    kept = [i for i, name in enumerate(info.site_names) if name != site_name]
    return dataclasses.replace(
        info,
        site_names=tuple(info.site_names[i] for i in kept),
        load_site=lambda index, size, scale, seed: info.load_site(kept[index], size, scale, seed),
    )


def dataset_info(name: str, data_paths: Mapping[str, str | Path] | None = None) -> DatasetInfo:
    """Look up a dataset by its run-config name, or read a federation spec (``*.toml``).

    Parameters
    ----------
    name : str
        A key of :data:`DATASETS`, ``synthetic-fundus-<K>`` (K generated
        fundus sites, see :mod:`fedsm_core.data.synthetic_copies`) or the
        path of a federation spec.
    data_paths : mapping, optional
        Site name -> data folder, replacing the spec's ``path`` (a SuperNode's
        own folder from its node config).

    Raises
    ------
    ValueError
        For an unknown name; the message lists the known ones.
    """
    if name.endswith(".toml"):
        return _federation(load_federation(locate_spec(name)), data_paths or {})
    count = fundus_site_count(name)
    if count is not None:
        return _synthetic_fundus_copies(count)
    if name not in DATASETS:
        raise ValueError(f"dataset = '{name}' is unknown; known datasets: {sorted(DATASETS)}, "
                         f"{PREFIX}<K> (K = 2..{MAX_SITES} sites) or the path of a federation spec (*.toml)")
    return DATASETS[name]()


def dataset_label(name: str) -> str:
    """A dataset's short name (result tables, run folders): a federation spec's file stem, else the name."""
    return Path(name).stem if name.endswith(".toml") else name


def training_dataset(dataset: str, held_out_site: str = "",
                     data_paths: Mapping[str, str | Path] | None = None) -> DatasetInfo:
    """The sites a run trains on: ``dataset`` without ``held_out_site`` (run-config keys)."""
    return hold_out(dataset_info(dataset, data_paths), held_out_site)
