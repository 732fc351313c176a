"""Settings fields that carry their run-config key and allowed values, and the checks that read them.

Each subsystem (training, FedSM, personalization, kNN-Per, HarmoFL, the server
optimizer, the stopping rule) owns one frozen settings dataclass beside its
code. Its fields are declared with :func:`setting`, which records the field's
kebab-case key and its allowed values; :func:`check_settings` enforces them
when the dataclass is built, and ``docs/configuration.md`` prints them
(:mod:`fedsm_core.command_line.configuration_page`), so each check is written
once. :class:`fedsm_core.config.RunConfig` composes the subsystems' settings
from the flat keys and adds where to set a key to the message.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any


def setting(default: Any, key: str, *, low: float | None = None, high: float | None = None,
            choices: Sequence[str] | None = None, allowed: str = "") -> Any:
    """A dataclass field with its run-config ``key`` and allowed values.

    Parameters
    ----------
    default
        The default value (the one place it is written).
    key : str
        The kebab-case run-config key, named in every error message.
    low, high : float, optional
        The closed range ``[low, high]`` the value must lie in.
    choices : sequence of str, optional
        The words the value must be one of.
    allowed : str, optional
        How the docs describe a bound checked elsewhere because it depends on
        another setting (e.g. ``"[0, image-size / 2]"``).
    """
    metadata = {"key": key, "low": low, "high": high, "choices": tuple(choices) if choices else None,
                "allowed": allowed}
    return dataclasses.field(default=default, metadata=metadata)


def check_settings(settings: Any) -> None:
    """Check every field of ``settings`` declared with :func:`setting` against its range or choices."""
    for field in dataclasses.fields(settings):
        meta = field.metadata
        if "key" not in meta:
            continue
        value = getattr(settings, field.name)
        if meta["low"] is not None:
            check_range(meta["key"], value, meta["low"], meta["high"])
        if meta["choices"] is not None:
            check_choice(meta["key"], value, meta["choices"])


def allowed_values(field: dataclasses.Field) -> str:
    """The allowed values of a :func:`setting` field as the docs print them (empty when unchecked)."""
    meta = field.metadata
    if meta.get("allowed"):
        return meta["allowed"]
    if meta.get("choices"):
        return ", ".join(f"`{choice}`" for choice in meta["choices"])
    if meta.get("low") is not None:
        return f"[{_number(meta['low'])}, {_number(meta['high'])}]"
    return ""


def _number(value: float) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return f"1e{len(str(value)) - 1}" if value >= 10**6 and str(value).strip("0") == "1" else str(value)


def check_range(key: str, value: float, low: float, high: float) -> None:
    """``ValueError`` naming ``key`` unless ``low <= value <= high`` (``nan`` fails too)."""
    if (isinstance(value, float) and math.isnan(value)) or not low <= value <= high:
        raise ValueError(f"{key} = {value} is outside [{low}, {high}]")


def check_choice(key: str, value: str, choices: Sequence[str]) -> None:
    """``ValueError`` naming ``key`` and listing the valid words unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{key} = '{value}' is not one of {list(choices)}")


def check_integer(key: str, value: int, low: int) -> None:
    """``ValueError`` naming ``key`` unless ``value`` is an integer (not a bool) ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} = {value!r} must be an integer >= {low}")
    if value < low:
        raise ValueError(f"{key} = {value} must be >= {low}")


def coerce_value(key: str, value: Any, default: Any, where: str) -> Any:
    """A run-config value as the type of the key's ``default`` (an int is a float, a whole float an int).

    ``TypeError`` names the key, the value found, the type expected and ``where`` to fix it.
    """
    expected = type(default)
    if expected is bool and not isinstance(value, bool):
        raise TypeError(f"run-config '{key}' = {value!r} must be true or false; {where}")
    if isinstance(value, bool) and expected is not bool:
        raise TypeError(f"run-config '{key}' = {value!r} is a boolean, expected {expected.__name__}; {where}")
    if expected is float and isinstance(value, int):
        return float(value)
    if expected is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, expected):
        raise TypeError(
            f"run-config '{key}' = {value!r} has type {type(value).__name__}, expected {expected.__name__}; {where}"
        )
    return value
