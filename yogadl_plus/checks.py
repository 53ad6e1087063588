"""Argument checks shared by the public constructors: errors quote the value and the range."""

from __future__ import annotations

import operator

import numpy as np

__all__ = ["check_bool", "check_int"]


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
