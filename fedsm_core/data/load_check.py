"""The data doctor's last check: load the site exactly as training would.

The doctor's file checks (:mod:`fedsm_core.data.doctor`) find unreadable
files, orphans and bad mask values, but not every reason loading fails: a site
with no image pairs, one training pair (no validation split is possible), an
empty test folder, or a shifted site's share of a shared folder. So when the
file checks pass, :func:`check_site_loads` runs the source's own loader (at a
small image size; sizes never change which files load) followed by the same
every-split check the run applies, and records what each split would hold.
The verdict is then OK only when training would load the site.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.doctor_report import SiteReport
from fedsm_core.data.files import DataError
from fedsm_core.data.sources import Options, data_source

LOAD_CHECK_SIZE = 16  # pixels; the smallest size every source accepts is 8
GENERATED_CHECK_SIZE = 32  # pixels; the smallest image-size a run accepts


def case_of_id(example_id: str) -> str:
    """The case part of an example id ``<site>/<case>/<slice>`` or ``<site>/<name>`` (its own case)."""
    parts = example_id.split("/")
    return parts[1] if len(parts) > 1 else example_id


def split_counts(site: SiteSplits) -> tuple[dict[str, int], dict[str, int]]:
    """Images and distinct cases per split of a loaded site."""
    splits = {"train": site.train, "val": site.val, "test": site.test}
    images = {name: len(arrays) for name, arrays in splits.items()}
    cases = {name: len({case_of_id(i) for i in arrays.ids}) for name, arrays in splits.items()}
    return images, cases


def check_site_loads(report: SiteReport, source_name: str, path: Path, options: Options,
                     seed: int = 0) -> SiteReport:
    """Load the site as a run would; record its split sizes or add the loader's error.

    Parameters
    ----------
    report : SiteReport
        The file checks' report; a report with errors is returned unchanged
        (its verdict is already ERRORS, and the loader would repeat them).
    options : mapping
        The site's merged source options.
    seed : int
        The run's ``data-seed`` (it decides the train/validation split).
    """
    if not report.ok:
        return report
    from fedsm_core.data.registry import require_every_split  # the registry imports every source

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # skipped orphans are already in the report
            site = data_source(source_name).load(Path(path), LOAD_CHECK_SIZE, seed, options, report.site)
            site = require_every_split(site, path)
    except (DataError, ValueError) as error:
        report.errors.append(f"training would not load this site: {error}")
        return report
    report.loaded, report.cases = split_counts(site)
    return report


def check_generated_dataset(name: str, scale: float, seed: int) -> list[SiteReport]:
    """One report per site of a generated dataset (``synthetic-fundus``, ...): what each split holds.

    Parameters
    ----------
    name : str
        The run config's ``dataset`` (a generated one; a spec goes to ``--federation``).
    scale, seed : float, int
        The run's ``data-scale`` and ``data-seed``: they decide the site sizes.
    """
    from fedsm_core.data.registry import dataset_info, require_every_split

    if name.endswith(".toml"):
        raise ValueError(f"--dataset {name} is a federation spec; check it with --federation {name}")
    info = dataset_info(name)
    reports = []
    for index, site_name in enumerate(info.site_names):
        report = SiteReport(site_name, f"generated (data-scale {scale}, data-seed {seed})", name)
        try:
            site = require_every_split(info.load_site(index, GENERATED_CHECK_SIZE, scale, seed), f"'{name}'")
        except (DataError, ValueError) as error:
            report.errors.append(f"training would not load this site: {error}")
        else:
            report.loaded, report.cases = split_counts(site)
        reports.append(report)
    return reports
