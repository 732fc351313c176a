"""Data sources a federation spec or the data doctor can name, with their options.

A source turns one site's folder into train/validation/test arrays
(``load``) and checks it without stopping at the first problem
(``inspect``). Options are the kebab-case keys of a site's table in a
federation spec; each source lists the ones it accepts and their defaults.

==================  =========================================================
source              folder of one site
==================  =========================================================
``fundus-dofe``     ``{train,test}/ROIs/{image,mask}/*.png`` (DoFE Fundus)
``prostate-slices`` ``{train,test}/{image,mask}/*.png`` (ProstateSlice)
``prostate-nifti``  ``CaseNN.nii.gz`` + ``CaseNN_segmentation.nii.gz``
``prostate-msd``    ``imagesTr/``, ``labelsTr/`` (Decathlon Task05_Prostate)
``drishti-shifted`` the Drishti-GS1 ROI folder; ``part`` picks one of six sites
==================  =========================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fedsm_core.data.arrays import SiteSplits
from fedsm_core.data.doctor_report import SiteReport
from fedsm_core.data.files import ORPHAN_POLICIES
from fedsm_core.data.masks import ENCODINGS, mask_encoding

Options = Mapping[str, object]


@dataclass(frozen=True)
class Source:
    """One kind of site folder.

    Attributes
    ----------
    name : str
        Name in specs and on the command line.
    defaults : mapping
        Accepted options and their default values.
    load : callable
        ``load(path, image_size, seed, options, name) -> SiteSplits``.
    inspect : callable
        ``inspect(path, options, name) -> SiteReport``; never raises for data problems.
    """

    name: str
    defaults: Mapping[str, object]
    load: Callable[[Path, int, int, Options, str], SiteSplits] = field(repr=False)
    inspect: Callable[[Path, Options, str], SiteReport] = field(repr=False)

    def options(self, given: Options, where: str) -> dict[str, object]:
        """``given`` merged over the defaults, checked; errors say ``where`` to fix them."""
        unknown = sorted(set(given) - set(self.defaults))
        if unknown:
            raise ValueError(f"{where}: option(s) {unknown} are not options of source '{self.name}'; "
                             f"accepted: {sorted(self.defaults)}")
        merged = {**self.defaults, **given}
        _check_common(merged, where)
        return merged

    def structures(self, options: Options) -> tuple[str, ...]:
        """Target names this source produces with ``options``."""
        return mask_encoding(str(options["mask-encoding"])).structures


def _check_common(options: dict[str, object], where: str) -> None:
    if "on-orphans" in options and options["on-orphans"] not in ORPHAN_POLICIES:
        raise ValueError(f"{where}: on-orphans = {options['on-orphans']!r} must be one of {list(ORPHAN_POLICIES)}")
    if "mask-encoding" in options and options["mask-encoding"] not in ENCODINGS:
        raise ValueError(f"{where}: mask-encoding = {options['mask-encoding']!r} must be one of {sorted(ENCODINGS)}")
    if "case-pattern" in options:
        from fedsm_core.data.cases import compile_case_pattern

        compile_case_pattern(str(options["case-pattern"]), where)
    if "val-split" in options:
        from fedsm_core.data.cases import VAL_SPLITS

        if options["val-split"] not in VAL_SPLITS:
            raise ValueError(f"{where}: val-split = {options['val-split']!r} must be one of {list(VAL_SPLITS)}")


def _png(layout: str, encoding: str) -> Source:
    from fedsm_core.data.cases import CASE_PATTERNS
    from fedsm_core.data.doctor import inspect_png_site
    from fedsm_core.data.png_layouts import load_png_site

    return Source(
        layout, {"mask-encoding": encoding, "on-orphans": "fail", "case-pattern": CASE_PATTERNS[layout],
                 "val-split": "case"},
        load=lambda path, size, seed, o, name: load_png_site(
            path, layout, size, seed, encoding=str(o["mask-encoding"]), on_orphans=str(o["on-orphans"]), name=name,
            case_pattern=str(o["case-pattern"]), val_split=str(o["val-split"])),
        inspect=lambda path, o, name: inspect_png_site(path, layout, str(o["mask-encoding"]), name),
    )


def _nifti(layout: str) -> Source:
    def load(path: Path, size: int, seed: int, o: Options, name: str) -> SiteSplits:
        from fedsm_core.data.nifti_volumes import load_nifti_site

        return load_nifti_site(path, size, seed, layout=layout, modality=int(o["modality"]),
                               empty_fraction=float(o["empty-fraction"]), on_orphans=str(o["on-orphans"]), name=name)

    def inspect(path: Path, o: Options, name: str) -> SiteReport:
        from fedsm_core.data.nifti_volumes import inspect_nifti_site

        return inspect_nifti_site(path, layout=layout, modality=int(o["modality"]), name=name)

    defaults = {"mask-encoding": "label-map", "on-orphans": "fail", "modality": 0, "empty-fraction": 0.1}
    return Source(f"prostate-{layout}" if layout == "msd" else "prostate-nifti", defaults, load, inspect)


def _drishti() -> Source:
    def load(path: Path, size: int, seed: int, o: Options, name: str) -> SiteSplits:
        from fedsm_core.data.drishti_sites import load_drishti_site

        return load_drishti_site(path, int(o["part"]) - 1, size, seed, name=name)

    def inspect(path: Path, o: Options, name: str) -> SiteReport:
        from fedsm_core.data.doctor import inspect_png_site

        report = inspect_png_site(path, "fundus-dofe", "dofe-fundus", name)
        report.source = "drishti-shifted"
        # The folder is shared by the six sites: its counts are not this site's (the loader check adds those).
        for split in report.splits:
            split.split = f"whole folder, {split.split} (shared by all six sites)"
        return report

    return Source("drishti-shifted", {"mask-encoding": "dofe-fundus", "part": 1}, load, inspect)


SOURCES: dict[str, Source] = {
    s.name: s for s in (_png("fundus-dofe", "dofe-fundus"), _png("prostate-slices", "inverted-binary"),
                        _nifti("multisite"), _nifti("msd"), _drishti())
}


def data_source(name: str) -> Source:
    """Look up a source by name; the error lists the known ones."""
    if name not in SOURCES:
        raise ValueError(f"data source '{name}' is unknown; known sources: {sorted(SOURCES)}")
    return SOURCES[name]
