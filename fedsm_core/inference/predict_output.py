"""The output folder of ``fedsm predict``: checked before anything is written, then filled.

``fedsm predict`` writes one mask PNG per image and ``predictions.csv`` into
``--out``. Two things must never happen there:

- an input image is overwritten by its mask, which happens when ``--out`` is
  the ``--images`` folder (a mask is named after its image), and
- results of two runs mix, which happens when a second run writes into a folder
  that already holds masks the new table does not list.

:func:`prepare_output_folder` therefore refuses ``--out`` when it is, lies
inside or contains ``--images``; refuses a folder with an earlier
``predictions.csv`` unless ``overwrite`` is set, and then first removes the
masks that table lists (and only those); and refuses to replace any other file
a new mask would be written over. Nothing is removed until every check passed.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from fedsm_core.data.files import DataError

TABLE_NAME = "predictions.csv"
CSV_COLUMNS = ("image", "mask", "width", "height", "model", "selector-confidence", "most-likely-site")


def mask_name(image: Path) -> str:
    """File name of an image's mask: its stem with ``.png``."""
    return f"{Path(image).stem}.png"


def _check_not_nested(images: Path, out: Path) -> None:
    images_abs, out_abs = images.resolve(), out.resolve()
    if out_abs == images_abs:
        problem = "is the --images folder: every mask would overwrite the image it was made from"
    elif out_abs.is_relative_to(images_abs):
        problem = f"lies inside the --images folder {images}: its masks would be read as images next time"
    elif images_abs.is_relative_to(out_abs):
        problem = f"contains the --images folder {images}"
    else:
        return
    raise DataError(f"--out {out} {problem}; pass an --out folder outside {images}")


def _earlier_masks(out: Path) -> list[Path]:
    """The masks an earlier ``predictions.csv`` in ``out`` lists (only plain names inside ``out``)."""
    table = out / TABLE_NAME
    try:
        with table.open(newline="") as handle:
            names = [row.get("mask") or "" for row in csv.DictReader(handle)]
    except (OSError, csv.Error, UnicodeDecodeError) as error:
        raise DataError(f"--out {out}: the earlier {TABLE_NAME} is unreadable ({error}); remove it yourself "
                        "or pass an empty --out folder") from None
    # A name with a folder part was not written by predict: never delete outside --out.
    return [out / name for name in names if name and Path(name).name == name]


def prepare_output_folder(images: Path, out: Path, mask_names: Sequence[str], overwrite: bool) -> None:
    """Check ``out`` for a run writing ``mask_names``, clear an earlier run if allowed, and create it.

    Raises
    ------
    DataError
        When ``out`` is, lies in or contains ``images``; when it holds an
        earlier ``predictions.csv`` and ``overwrite`` is False; when a mask
        would replace a file no earlier table lists. Nothing is removed then.
    """
    images, out = Path(images), Path(out)
    _check_not_nested(images, out)
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; pass a folder")
    earlier: list[Path] = []
    if (out / TABLE_NAME).exists():
        if not overwrite:
            raise DataError(f"--out {out} holds the predictions of an earlier run ({TABLE_NAME}); pass --overwrite "
                            "to replace them (the masks it lists are removed first) or choose another --out")
        earlier = _earlier_masks(out)
    earlier_names = {path.name for path in earlier}
    foreign = sorted(name for name in mask_names if (out / name).exists() and name not in earlier_names)
    if foreign:
        raise DataError(f"--out {out} already holds {foreign[:5]}{' ...' if len(foreign) > 5 else ''}, which no "
                        f"earlier {TABLE_NAME} lists; predict does not replace files it did not write: "
                        "choose another --out")
    for path in earlier:
        path.unlink(missing_ok=True)
    (out / TABLE_NAME).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def write_outputs(rows: Sequence[dict], out: Path) -> Path:
    """Write each row's mask PNG and ``predictions.csv``; the table's path.

    Each row holds ``path`` (the image), ``mask`` (``uint8 [H, W]``) and the
    values of the table's last five columns.
    """
    table = Path(out) / TABLE_NAME
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            name = mask_name(row["path"])
            Image.fromarray(row["mask"]).save(Path(out) / name)
            writer.writerow({**{k: row[k] for k in CSV_COLUMNS[2:]}, "image": row["path"].name, "mask": name})
    return table
