"""Argument checks shared by the public constructors: errors quote the value and the range."""

from __future__ import annotations

import operator
import re

import numpy as np

__all__ = [
    "MAX_NAME_LENGTH",
    "check_bool",
    "check_index",
    "check_indices",
    "check_int",
    "check_name",
]

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
    number = _as_int(value)
    if number is None:
        raise ValueError(
            f"{name} must be an int in {allowed}, got {value!r} of type {type(value).__name__}"
        )
    if number < low or (high is not None and number > high):
        raise ValueError(f"{name} must be in {allowed}, got {number}")
    return number


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r} of type {type(value).__name__}")
    return bool(value)


def check_index(index: object, n: int, owner: str, noun: str) -> int:
    """``index`` of a sequence of ``n`` (negative counts from the end) as an int in [0, n):
    TypeError for a non-int (naming ``owner``), IndexError naming the ``noun`` and the range."""
    i = index if type(index) is int else _as_int(index)  # (ints first: ref[i] is hot)
    if i is None:
        raise TypeError(
            f"{owner} indices are ints, slices, or lists or arrays of ints (or of bools, one "
            f"per item), got {type(index).__name__}"
        )
    if not -n <= i < n:
        raise IndexError(f"{noun} {i} is out of range [-{n}, {n})")
    return i + n if i < 0 else i


def check_selection(index: object, n: int, owner: str, noun: str) -> int | np.ndarray:
    """What ``owner[index]`` picks of ``n`` items, as numpy does: an int for one (see
    ``check_index``); for a slice, a list or array of ints, or a mask of one bool per item,
    the int64 indices of many (the get_batch form)."""
    if isinstance(index, slice):
        return np.arange(*index.indices(n), dtype=np.int64)
    if isinstance(index, (list, tuple, np.ndarray)):
        mask = np.asarray(index)
        if mask.dtype == bool and mask.ndim == 1:
            if len(mask) != n:
                raise IndexError(f"a mask of {len(mask)} bools for {n} items; give one per item")
            return np.flatnonzero(mask)
        return check_indices(index, n, noun)
    return check_index(index, n, owner, noun)


def check_indices(indices: object, n: int, noun: str) -> np.ndarray:
    """``indices`` (a 1-d sequence of ints, negatives counting from the end) as int64 in
    [0, n): TypeError for anything else, IndexError naming the ``noun`` out of range."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise TypeError(
            f"indices must be a 1-d sequence of ints, got {idx.dtype} with shape {idx.shape}"
        )
    idx = idx.astype(np.int64, copy=False)
    if idx.size:
        low, high = int(idx.min()), int(idx.max())
        if low < -n or high >= n:
            raise IndexError(f"{noun} {low if low < -n else high} is out of range [-{n}, {n})")
        if low < 0:
            idx = np.where(idx < 0, idx + n, idx)
    return idx


def _as_int(value: object) -> int | None:
    """The int ``value`` stands for as an index (an int, a numpy integer), else None."""
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
