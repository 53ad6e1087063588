"""Skip lists: records a stream never hands out, given by index (``stream(..., skip=...)``).

A skipped record still counts as a position, as a predicate's reject does, so offsets, shards
and elastic resume keep their meaning, and a state saved without a skip list (or with another)
loads into a stream with one: a long run drops the records found bad and goes on. The indices
are kept sorted, or as a mask of the records where that is no bigger: a unit's test is a binary
search or a single read per record, whatever their number.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from yogadl_plus.recordsource import RecordSource

__all__ = ["Skips", "skipped"]


class Skips:
    """Sorted, unique record indices to skip, per leaf of the source (a DataRef's one leaf is
    named ""; a mixture's leaves by their path, "web" or "text/books")."""

    def __init__(self, given: Any) -> None:
        if isinstance(given, Mapping):
            self.by_leaf = {
                _name(name): _indices(f"skip[{name!r}]", v) for name, v in given.items()
            }
            self.per_source = True
        else:
            self.by_leaf = {"": _indices("skip", given)}
            self.per_source = False

    def __repr__(self) -> str:
        counts = {name: len(v) for name, v in self.by_leaf.items()}
        return f"Skips({counts if self.per_source else counts['']})"

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_leaf.values())

    def for_source(self, source: RecordSource) -> list[np.ndarray | None]:
        """Each leaf's indices to skip (None: none), checked against ``source``: a mapping
        for a mixture naming its sources, indices in range (IndexError naming the source)."""
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
            if indices is not None and len(indices):
                size = len(leaf.ref)
                if indices[-1] >= size:
                    where = f" of source {leaf.name!r}" if leaf.name else ""
                    raise IndexError(
                        f"skip= holds record {int(indices[-1])}{where}, out of range [0, {size})"
                    )
            out.append(
                _lookup(indices, len(leaf.ref)) if indices is not None and len(indices) else None
            )
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


def _indices(what: str, given: Any) -> np.ndarray:
    """``given`` (an iterable of record indices >= 0) as a sorted, unique int64 array."""
    if isinstance(given, (str, bytes)) or not isinstance(given, (Iterable, np.ndarray)):
        raise ValueError(f"{what} must be record indices (a list or array of ints), got {given!r}")
    array = np.asarray(given if isinstance(given, np.ndarray) else list(given))
    if array.size == 0:
        return np.zeros(0, np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        try:
            array = np.array([operator.index(v) for v in array.ravel().tolist()], np.int64)
        except TypeError:
            raise ValueError(
                f"{what} must be record indices (ints), got dtype {array.dtype}"
            ) from None
    array = np.unique(array.astype(np.int64, copy=False))
    if array[0] < 0:
        raise ValueError(f"{what} holds {int(array[0])}: record indices are >= 0")
    return array
