"""Bounds on what a site reports from an evaluation, checked before any of it is used.

A site's evaluation metrics choose FedSM's gamma for every site (the
validation sweeps, pooled by image count) and fill the run's tables. A site
that reports numbers no evaluation can produce (a Dice of 5, a count beyond
the images it reported at discovery) would steer that choice or the tables
alone, so the server refuses the whole reply, as it refuses a malformed
training reply, and records the site as having no result for that round.

Checked (the metric names of :mod:`fedsm_core.evaluation.super_model_evaluation`
and :mod:`fedsm_core.evaluation.case_scores`):

- ``num-images``: a whole number in ``[0, N]``, ``N`` the count of the split the
  site reported at discovery;
- Dice values, shares and accuracies (``dice-*``, ``case-dice-*``, ``routed-dice-*``,
  ``share-*``, ``empty-fp-*``, ``selector-accuracy``, ``gamma``, ``knn-lambda``,
  ``knn-lambda-super``) and the
  sweeps ``dice-super-sweep``, ``share-global-sweep``: in ``[0, 1]``, or NaN where
  nothing was there to score;
- counts (``num-empty``, ``num-routed-*``, ``routed-count-sweep``) in ``[0, num-images]``;
- ``routing-gain-sweep`` (a sum of per-image Dice differences) within ``num-images`` of 0;
- no value is infinite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from flwr.app import RecordDict

from app_protocol.evaluate_messages import decode_metrics

UNIT_PREFIXES = ("dice-", "case-dice-", "routed-dice-", "share-", "empty-fp-")
UNIT_KEYS = ("selector-accuracy", "gamma", "knn-lambda", "knn-lambda-super")
UNIT_SWEEPS = ("dice-super-sweep", "share-global-sweep")
COUNT_PREFIXES = ("num-routed-",)
COUNT_KEYS = ("num-empty",)
COUNT_SWEEPS = ("routed-count-sweep",)
GAIN_SWEEPS = ("routing-gain-sweep",)


def _check_range(key: str, values: Iterable[float], low: float, high: float, nan_ok: bool) -> None:
    for value in values:
        if math.isnan(value) and nan_ok:
            continue
        if not low <= value <= high:
            raise ValueError(f"{key} = {value!r} is outside [{low:g}, {high:g}]")


def _is_unit(key: str) -> bool:
    return key in UNIT_KEYS or (key.startswith(UNIT_PREFIXES) and not key.endswith("-sweep"))


def check_metrics(numbers: Mapping[str, float], lists: Mapping[str, list[float]], reported_images: int | None) -> None:
    """Raise ``ValueError`` naming the first metric outside its bounds (see the module's list).

    Parameters
    ----------
    numbers, lists : mapping
        A reply's scalar metrics and sweeps (:func:`app_protocol.evaluate_messages.decode_metrics`).
    reported_images : int or None
        The images of the evaluated split the site reported at discovery; None: no cap.
    """
    for key, value in [*numbers.items(), *((k, v) for k, values in lists.items() for v in values)]:
        if math.isinf(value):
            raise ValueError(f"{key} = {value!r} is not finite")
    images = numbers.get("num-images")
    if images is None or math.isnan(images) or images != int(images) or images < 0:
        raise ValueError(f"num-images = {images!r}; expected a whole number of images")
    if reported_images is not None and images > reported_images:
        raise ValueError(f"num-images = {images:g} is more than the {reported_images} images the site reported "
                         "for this split at discovery")
    for key, value in numbers.items():
        if _is_unit(key):
            _check_range(key, [value], 0.0, 1.0, nan_ok=True)
        elif key in COUNT_KEYS or key.startswith(COUNT_PREFIXES):
            _check_range(key, [value], 0.0, images, nan_ok=False)
    for key, values in lists.items():
        if key in UNIT_SWEEPS:
            _check_range(key, values, 0.0, 1.0, nan_ok=True)
        elif key in COUNT_SWEEPS:
            _check_range(key, values, 0.0, images, nan_ok=False)
        elif key in GAIN_SWEEPS:
            _check_range(key, values, -images, images, nan_ok=False)


def checked_metrics(content: RecordDict, reported_images: int | None) -> tuple[dict[str, float],
                                                                                dict[str, list[float]]]:
    """:func:`~app_protocol.evaluate_messages.decode_metrics` of a reply, after :func:`check_metrics`."""
    numbers, lists = decode_metrics(content)
    check_metrics(numbers, lists, reported_images)
    return numbers, lists
