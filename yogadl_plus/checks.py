"""Argument checks shared by the public constructors: errors quote the value and the range."""

from __future__ import annotations

import operator
import re

import numpy as np

__all__ = ["MAX_NAME_LENGTH", "check_bool", "check_int", "check_name"]

_NAME = re.compile(r"[A-Za-z0-9._-]+")
# File names may have 255 bytes; a version's bookkeeping entries add up to 22 characters to its
# name ("+staging.<version>.<12 hex>"), and some room is left for what later releases add.
MAX_NAME_LENGTH = 200


def check_name(what: str, name: object) -> str:
    """``name`` if it is a valid dataset_id / version, else ValueError saying why."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty str, got {name!r}")
    if not _NAME.fullmatch(name) or name == "." or ".." in name:
        raise ValueError(
            f"{what} {name!r} is not allowed: use letters, digits, '.', '_' and '-' only, "
            "not '.' alone and no '..'"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{what} {name[:40]}... is {len(name)} characters long; at most {MAX_NAME_LENGTH} "
            "are allowed (it names folders and files, which filesystems limit to 255 bytes)"
        )
    return name


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """Returns ``value`` as an int in ``[low, high]``, or raises ValueError quoting it."""
    allowed = f"[{low}, {high}]" if high is not None else f"[{low}, inf)"
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an int in {allowed}, got the bool {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(
            f"{name} must be an int in {allowed}, got {value!r} of type {type(value).__name__}"
        ) from None
    if number < low or (high is not None and number > high):
        raise ValueError(f"{name} must be in {allowed}, got {number}")
    return number


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r} of type {type(value).__name__}")
    return bool(value)
