"""Federation specs: one TOML file naming the sites and where each one's data is.

Example (``experiments/federations/multisite-prostate.toml``)::

    name = "multisite-prostate"

    [[sites]]
    name = "BIDMC"
    source = "prostate-slices"
    path = "../../../shared/data/multisite-samples/ProstateSlice/BIDMC"

    [[sites]]
    name = "I2CVB"
    source = "prostate-slices"
    path = "../../../shared/data/multisite-samples/ProstateSlice/I2CVB"
    on-orphans = "skip"   # any other key is an option of the source

Select it with ``dataset = "<path to the spec>.toml"`` in the run config.
Relative data paths are relative to the spec's folder; ``~`` and ``$VARS``
are expanded. In simulation every node loads its site's ``path``. In
deployment each SuperNode names its site and its own data folder in its node
config (``--node-config "site-name='BIDMC' data-path='/data/prostate'"``) and
the spec may leave ``path`` out: only the site list and sources are shared.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from fedsm_core.data.sources import data_source

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SITE_KEYS = ("name", "source", "path")


@dataclass(frozen=True)
class SiteSpec:
    """One site of a federation: its name, data source, data folder and options."""

    name: str
    source: str
    path: Path | None
    options: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class FederationSpec:
    """The sites of a federation, in the order of the selector's outputs."""

    file: Path
    name: str
    sites: tuple[SiteSpec, ...]

    @property
    def site_names(self) -> tuple[str, ...]:
        """Site names in spec order."""
        return tuple(site.name for site in self.sites)

    def structures(self) -> tuple[str, ...]:
        """The targets every site produces; sites that disagree are an error."""
        found = {site.name: data_source(site.source).structures(site.options) for site in self.sites}
        distinct = set(found.values())
        if len(distinct) != 1:
            raise ValueError(f"{self.file}: sites produce different targets {found}; "
                             "every site of a federation must segment the same structures")
        return distinct.pop()


def locate_spec(value: str) -> Path:
    """The spec file named by a run-config ``dataset`` value.

    A relative path is tried against the working directory, then the project
    folder (the ServerApp and ClientApps of a simulation run in other folders).
    """
    path = Path(os.path.expandvars(value)).expanduser()
    candidates = [path] if path.is_absolute() else list(dict.fromkeys([Path.cwd() / path, PROJECT_ROOT / path]))
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise ValueError(f"dataset = '{value}': no federation spec found (tried {tried}); "
                     "give an absolute path or one relative to the project folder")


def load_federation(path: Path) -> FederationSpec:
    """Read and check a federation spec.

    Raises
    ------
    ValueError
        For unreadable TOML, a missing or duplicate site name, an unknown
        source or option; every message names the file and the site.
    """
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"federation spec {path}: cannot read it ({error})") from None
    unknown = sorted(set(document) - {"name", "sites"})
    if unknown:
        raise ValueError(f"federation spec {path}: unknown top-level keys {unknown}; expected 'name' and [[sites]]")
    tables = document.get("sites")
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"federation spec {path}: no [[sites]] tables; add one per site")
    sites = tuple(_parse_site(path, i, table) for i, table in enumerate(tables))
    names = [s.name for s in sites]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"federation spec {path}: site names {duplicates} appear more than once")
    spec = FederationSpec(path, str(document.get("name", path.stem)), sites)
    spec.structures()
    return spec


def _parse_site(file: Path, index: int, table: dict) -> SiteSpec:
    where = f"federation spec {file}, site #{index + 1}"
    for key in ("name", "source"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise ValueError(f"{where}: '{key}' is missing or not a string")
    where = f"federation spec {file}, site '{table['name']}'"
    try:
        source = data_source(table["source"])
    except ValueError as error:  # name the file and the site, as every spec error does
        raise ValueError(f"{where}: {error}") from None
    options = source.options({k: v for k, v in table.items() if k not in SITE_KEYS}, where)
    raw = table.get("path")
    if raw is not None and not isinstance(raw, str):
        raise ValueError(f"{where}: 'path' must be a string")
    return SiteSpec(table["name"], table["source"], resolve_data_path(raw, file.parent) if raw else None, options)


def resolve_data_path(raw: str, base: Path) -> Path:
    """``raw`` with ``~`` and ``$VARS`` expanded, relative paths taken from ``base``."""
    path = Path(os.path.expandvars(raw)).expanduser()
    return path if path.is_absolute() else (base / path).resolve()
