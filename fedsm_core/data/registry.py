"""Datasets a run can name in ``dataset``: their sites, structures and loaders."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.synthetic_fundus import FUNDUS_SITES, generate_site


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
    """

    site_names: tuple[str, ...]
    structures: tuple[str, ...]
    load_site: Callable[[int, int, float, int], SiteSplits]

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


DATASETS: dict[str, Callable[[], DatasetInfo]] = {"synthetic-fundus": _synthetic_fundus}


def dataset_info(name: str) -> DatasetInfo:
    """Look up a dataset by its run-config name.

    Raises
    ------
    ValueError
        For an unknown name; the message lists the known ones.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset = '{name}' is unknown; known datasets: {sorted(DATASETS)}")
    return DATASETS[name]()
