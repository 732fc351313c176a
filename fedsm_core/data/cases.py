r"""Cases (patients) of slice layouts: whole cases go to train or validation, never both.

A ProstateSlice site stores one PNG per MR slice, named ``<case>_<slice>``
(``00_01``, ``00_02``, ...). Neighbouring slices of one patient are nearly the
same image, so a split by slice puts the same patient on both sides and
validation Dice, which chooses gamma, the kNN-Per lambda and the settings of
``experiments.paper.tune``, measures memory instead of generalization. Splits
therefore draw whole cases.

The case of a file is the first group of a regular expression that must match
its whole name (without suffix), the ``case-pattern`` option of a site:

==================  ===================  ==========================================
layout              default pattern      case of
==================  ===================  ==========================================
``prostate-slices`` ``(.+?)(?:_\d+)?``   ``00_01`` -> ``00``; ``Case07_003`` ->
                                         ``Case07``; a name without ``_<digits>``
                                         is its own case
``fundus-dofe``     ``(.+)``             every image is its own case
==================  ===================  ==========================================

The test split is the layout's ``test`` folder, taken as given; case names are
compared within one folder.

Example ids carry the case: a slice of a case reads ``"<site>/<case>/<slice>"``
(``"BIDMC/Case07/z012"`` from a NIfTI volume, ``"site-1/00/00_01"`` from a slice
layout), an image that is its own case ``"<site>/<image>"`` (fundus
``"site-3/0007"``). :func:`named_case` reads it back for scores and routing per case.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from fedsm_core.data.files import DataError
from fedsm_core.data.preprocess import split_off

CASE_PATTERNS = {"prostate-slices": r"(.+?)(?:_\d+)?", "fundus-dofe": r"(.+)"}
# The ``val-split`` option of slice layouts: validation drawn as whole cases, or file by file.
VAL_SPLITS = ("case", "file")
EACH_FILE = re.compile(r"(.+)")  # every file its own case: the split of val-split = "file"


def compile_case_pattern(pattern: str, where: str) -> re.Pattern[str]:
    """``pattern`` compiled, with at least one group (the case); errors say ``where`` to fix it."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ValueError(f"{where}: case-pattern = {pattern!r} is not a regular expression ({error})") from None
    if compiled.groups < 1:
        raise ValueError(f"{where}: case-pattern = {pattern!r} has no group; put the case part of a file name "
                         "in parentheses, e.g. '(.+?)_\\d+' for <case>_<slice>")
    return compiled


def case_of(stem: str, pattern: re.Pattern[str], folder: Path | str) -> str:
    """The case of the file ``stem`` in ``folder``: the first group of the full match.

    Raises
    ------
    DataError
        Naming the file and the pattern when the name does not match.
    """
    match = pattern.fullmatch(stem)
    if match is None or not match.group(1):
        raise DataError(f"file name '{stem}' in {folder} does not match case-pattern = '{pattern.pattern}'; set the "
                        "site's case-pattern option to a regular expression whose first group is the case")
    return match.group(1)


def group_by_case(stems: Sequence[str], pattern: re.Pattern[str], folder: Path | str) -> dict[str, list[str]]:
    """Case -> its file stems (sorted), for every stem."""
    cases: dict[str, list[str]] = {}
    for stem in sorted(stems):
        cases.setdefault(case_of(stem, pattern, folder), []).append(stem)
    return cases


def split_cases_off(stems: Sequence[str], pattern: re.Pattern[str], fraction: float, seed: int, salt: str,
                    folder: Path | str) -> tuple[list[str], list[str]]:
    """``(kept, split_off)`` stems, with ``round(fraction * cases)`` whole cases split off.

    The draw is :func:`fedsm_core.data.preprocess.split_off` on the case names,
    so it depends only on the sorted cases, ``seed`` and ``salt``.

    Raises
    ------
    DataError
        When ``fraction > 0`` but the files hold a single case: no split by
        case is possible; the message gives the count and the fix.
    """
    cases = group_by_case(stems, pattern, folder)
    if fraction > 0 and len(cases) == 1 and len(stems) > 1:
        (only, files), = cases.items()
        raise DataError(f"{folder} holds {len(files)} files of one case ('{only}' by case-pattern = "
                        f"'{pattern.pattern}'); the validation split takes whole cases, so it needs two or more. "
                        "Add cases, or set val-split = \"file\" to draw validation file by file (slices of one "
                        "case then sit on both sides; the ids keep their case)")
    kept, taken = split_off(list(cases), fraction, seed, salt)
    return [s for c in kept for s in cases[c]], [s for c in taken for s in cases[c]]


def named_case(example_id: str) -> str | None:
    """The case of an example id: ``"<site>/<case>"`` of ``"<site>/<case>/<slice>"``, else ``None``.

    An id of three or more ``/``-separated parts is a slice of a case (everything
    before the last ``/``, so equal case names at two sites stay apart); an id of
    one or two parts (``"site-3/0007"``) is an image that is its own case, and has none.
    (The data doctor's count of cases, :func:`fedsm_core.data.load_check.case_of_id`,
    counts such an image as a case of its own.)
    """
    head, separator, _ = example_id.rpartition("/")
    return head if separator and "/" in head else None


def slice_number(example_id: str) -> int | None:
    """The trailing digits of an id's last part (``z012`` -> 12, ``00_01`` -> 1), or ``None`` when it has none."""
    match = re.search(r"(\d+)$", example_id.rpartition("/")[2])
    return int(match.group(1)) if match else None
