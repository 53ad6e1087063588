"""Skip lists: records a stream never hands out, given by index (``stream(..., skip=...)``).

A skipped record still counts as a position, as a predicate's reject does, so offsets, shards
and elastic resume keep their meaning, and a state saved without a skip list (or with another)
loads into a stream with one: a long run drops the records found bad and goes on. A skip list
is record indices (any 1-D sequence or array of ints) or a bool mask with one value per record;
for a mixture, a mapping of source name to either. The indices are kept sorted, or as a mask of
the records where that is no bigger: a unit's test is a binary search or a single read per
record, whatever their number.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from yogadl_plus.streamsource import StreamSource

__all__ = ["Skips", "skipped"]

_LARGEST_INDEX = int(np.iinfo(np.int64).max)
_SHOWN = 60  # characters of a value an error message shows


class Skips:
    """Sorted, unique record indices to skip, per leaf of the source (a DataRef's one leaf is
    named ""; a mixture's leaves by their path, "web" or "text/books"), and the length of each
    given as a bool mask (checked against its source's)."""

    def __init__(self, given: Any) -> None:
        found = (
            {_name(name): _indices(f"skip[{name!r}]", v) for name, v in given.items()}
            if isinstance(given, Mapping)
            else {"": _indices("skip", given)}
        )
        self.per_source = isinstance(given, Mapping)
        self.by_leaf = {name: indices for name, (indices, _) in found.items()}
        #: The leaves given as bool masks, and each mask's length.
        self.mask_lengths = {name: n for name, (_, n) in found.items() if n is not None}

    def __repr__(self) -> str:
        counts = {name: len(v) for name, v in self.by_leaf.items()}
        return f"Skips({counts if self.per_source else counts['']})"

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_leaf.values())

    def identity(self) -> dict[str, Any]:
        """What a stream state records of this skip list: how many records it skips, and
        the SHA-256 of which (each source's name and sorted indices; a bool mask and the
        indices of its True values are alike)."""
        digest = hashlib.sha256()
        for name in sorted(self.by_leaf):
            indices = self.by_leaf[name]
            if len(indices):
                digest.update(f"{name}\0{len(indices)}\0".encode())
                digest.update(indices.astype("<i8", copy=False).tobytes())
        return {"records": len(self), "sha256": digest.hexdigest()}

    def for_source(self, source: StreamSource) -> list[np.ndarray | None]:
        """Each leaf's indices to skip (None: none), checked against ``source``: a mapping
        for a mixture naming its sources, indices in range and masks as long as their source
        (ValueError naming the source)."""
        leaves = source.leaves
        names = [leaf.name for leaf in leaves]
        if self.per_source != any(names):
            if self.per_source:
                raise ValueError(
                    "skip= is a mapping of source name -> indices for a mixture; for one "
                    "dataset give the indices themselves"
                )
            raise ValueError(
                f"skip= of a mixture is a mapping of source name -> indices (its sources: {names})"
            )
        unknown = sorted(set(self.by_leaf) - set(names))
        if unknown:
            raise ValueError(f"skip= names {unknown}, which are not sources (the sources: {names})")
        out: list[np.ndarray | None] = []
        for leaf in leaves:
            indices = self.by_leaf.get(leaf.name)
            size = len(leaf.ref)
            where = f" of source {leaf.name!r}" if leaf.name else ""
            mask = self.mask_lengths.get(leaf.name)
            if mask is not None and mask != size:
                raise ValueError(
                    f"skip{where} is a bool mask of {mask} values, but the source has {size} "
                    "records: a mask has one value per record"
                )
            if indices is not None and len(indices) and indices[-1] >= size:
                raise ValueError(
                    f"skip= holds record {int(indices[-1])}{where}, out of range [0, {size})"
                )
            out.append(_lookup(indices, size) if indices is not None and len(indices) else None)
        return out


def skipped(indices: np.ndarray, skip: np.ndarray) -> np.ndarray:
    """Which of ``indices`` are skipped (a bool mask): ``skip`` is a mask of the source's
    records, or its sorted indices."""
    if skip.dtype == np.bool_:
        return skip[indices]
    at = np.searchsorted(skip, indices)
    at[at == len(skip)] = 0
    return skip[at] == indices


def _lookup(indices: np.ndarray, size: int) -> np.ndarray:
    """How a leaf's skipped ``indices`` are looked up: a mask of its ``size`` records where
    that takes no more memory than the indices (one read per test instead of a binary search
    over megabytes), else the sorted indices themselves."""
    if size > 8 * len(indices):
        return indices
    mask = np.zeros(size, np.bool_)
    mask[indices] = True
    return mask


def _name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"skip= names sources by their names (strs), got {name!r}")
    return name


def _indices(what: str, given: Any) -> tuple[np.ndarray, int | None]:
    """``given`` (record indices >= 0, or a bool mask of the records) as sorted, unique int64
    indices, and the mask's length (None: indices were given). ValueError naming ``what`` and
    the value that is not a record index."""
    if isinstance(given, (str, bytes)) or not isinstance(given, (Iterable, np.ndarray)):
        raise ValueError(
            f"{what} must be record indices (a list or array of ints) or a bool mask, "
            f"got {_shown(given)}"
        )
    values = given if isinstance(given, np.ndarray) else _array(list(given))
    if values.ndim != 1:
        raise ValueError(
            f"{what} must be record indices or a bool mask, one flat list: got an array of "
            f"shape {values.shape}, such as {_shown(values.reshape(-1)[:3].tolist())}"
        )
    if values.dtype == np.bool_:
        return np.flatnonzero(values).astype(np.int64), len(values)
    if values.size == 0:
        return np.zeros(0, np.int64), None
    if values.dtype.kind == "O":
        values = np.array([_index(what, v) for v in values.tolist()], dtype=object)
    elif values.dtype.kind not in "iu":
        wrong = values[0].item()
        raise ValueError(
            f"{what} must be record indices (ints) or a bool mask: it holds {_shown(wrong)} "
            f"(dtype {values.dtype})"
        )
    # (The largest and least as Python ints: a uint64 past 2**63 stays the number given.)
    largest, least = int(values.max()), int(values.min())
    if largest > _LARGEST_INDEX:
        raise ValueError(f"{what} holds record {largest}, out of range for any dataset")
    if least < 0:
        raise ValueError(f"{what} holds {least}: record indices are >= 0")
    return np.unique(values.astype(np.int64)), None


def _array(items: list[Any]) -> np.ndarray:
    """``items`` as an array: of objects where numpy cannot make one of them (lists of
    different lengths, ints past 64 bits), to be checked one by one."""
    try:
        return np.asarray(items)
    except (ValueError, OverflowError):
        out = np.empty(len(items), dtype=object)
        for k, item in enumerate(items):
            out[k] = item
        return out


def _index(what: str, value: Any) -> int:
    """One value of a skip list of objects, as an int: ValueError naming it if it is not one
    (a list within the list, a float, a bool among ints)."""
    if isinstance(value, (bool, np.bool_, Iterable, np.ndarray)):
        kind = "a bool among indices" if isinstance(value, (bool, np.bool_)) else "not flat"
        raise ValueError(
            f"{what} must be record indices or a bool mask, one flat list: it holds "
            f"{_shown(value)} ({kind})"
        )
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(
            f"{what} must be record indices (ints) or a bool mask: it holds {_shown(value)} "
            f"(a {type(value).__name__})"
        ) from None


def _shown(value: Any) -> str:
    """``value``'s repr, cut short for an error message."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."
