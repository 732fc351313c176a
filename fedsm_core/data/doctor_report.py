"""What the data doctor found in one site: counts, sizes, label values and problems.

Every source fills the same report, so ``fedsm check-data`` prints one
format for PNG layouts and NIfTI volumes alike. *Errors* stop training
(unreadable files, orphans, unexpected mask values, size mismatches, missing
folders); *warnings* are worth a look but are legal data (empty masks).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class SplitReport:
    """Findings for one split (``train``/``test``) or, for volumes, one site folder.

    Attributes
    ----------
    split : str
        Split or group name.
    count : int
        Usable examples found (image/mask pairs, or volumes).
    sizes : Counter
        Image size (``"WxH"`` or ``"WxHxD"``) -> number of files.
    mask_values : set of int
        Every label value seen in the masks.
    empty_masks : list of str
        Files whose mask has no structure pixel.
    orphans : list of str
        Files without a partner, with what is missing.
    errors : list of str
        Problems that stop loading, each naming the file and the fix.
    """

    split: str
    count: int = 0
    sizes: Counter = field(default_factory=Counter)
    mask_values: set[int] = field(default_factory=set)
    empty_masks: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class SiteReport:
    """Findings for one site folder."""

    site: str
    path: str
    source: str
    splits: list[SplitReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    orphans_skipped: bool = False  # the site's on-orphans option is "skip"
    loaded: dict[str, int] = field(default_factory=dict)  # images per split the loader made (train/val/test)
    cases: dict[str, int] = field(default_factory=dict)  # distinct cases (patients) per split

    @property
    def ok(self) -> bool:
        """No errors; orphans count as errors unless the site skips them (``on-orphans = "skip"``)."""
        orphans = not self.orphans_skipped and any(s.orphans for s in self.splits)
        return not self.errors and not orphans and not any(s.errors for s in self.splits)


def _format_values(values: set[int]) -> str:
    shown = sorted(values)
    return "{" + ", ".join(map(str, shown[:12])) + (", ..." if len(shown) > 12 else "") + "}"


def _format_sizes(sizes: Counter) -> str:
    return ", ".join(f"{size} x{n}" for size, n in sizes.most_common(4)) + (" ..." if len(sizes) > 4 else "")


def format_site(report: SiteReport, max_items: int = 20) -> list[str]:
    """Text lines for one site: a header, one line per split, then each problem."""
    verdict = "OK" if report.ok else "ERRORS"
    if report.ok and report.orphans_skipped and any(s.orphans for s in report.splits):
        verdict = "OK (orphans are skipped: on-orphans = \"skip\")"
    lines = [f"site {report.site} ({report.source}) at {report.path}: {verdict}"]
    lines += [f"  error: {e}" for e in report.errors]
    for split in report.splits:
        lines.append(f"  {split.split}: {split.count} usable, sizes {_format_sizes(split.sizes) or '-'}, "
                     f"mask values {_format_values(split.mask_values)}, {len(split.empty_masks)} empty masks, "
                     f"{len(split.orphans)} orphans, {len(split.errors)} errors")
        for kind, items in (("orphan", split.orphans), ("error", split.errors), ("empty mask", split.empty_masks)):
            lines += [f"    {kind}: {item}" for item in items[:max_items]]
            if len(items) > max_items:
                lines.append(f"    ... and {len(items) - max_items} more {kind}s")
    if report.loaded:
        images = ", ".join(f"{split} {count}" for split, count in report.loaded.items())
        cases = ", ".join(f"{split} {count}" for split, count in report.cases.items())
        lines.append(f"  training loads: {images} images; cases: {cases}")
    return lines


def format_reports(reports: list[SiteReport]) -> str:
    """The doctor's full text output, ending with a one-line verdict."""
    lines: list[str] = []
    for report in reports:
        lines += format_site(report)
    bad = [r.site for r in reports if not r.ok]
    lines.append(f"{len(reports)} site(s) checked; " + (f"errors in {bad}" if bad else "no errors"))
    return "\n".join(lines)
