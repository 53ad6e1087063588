"""The work done at the boundary for one block of a stream's positions.

Read the records (or n-gram windows) at those positions, drop those the predicate rejects
(decoding only the predicate's fields for them), decode the selected fields of the rest, run
the transform. A BlockReader is picklable, so the same work runs inline, in threads or in
worker processes, and gives the same result.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from yogadl_plus.errors import YogaError

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef
    from yogadl_plus.ngram import NGram
    from yogadl_plus.predicates import Predicate
    from yogadl_plus.schema import Field

__all__ = ["Block", "BlockReader", "TransformError", "collate", "records"]

_NAMED = 8  # records an error message lists for a block


class TransformError(YogaError):
    """The user's transform raised; the message names the record (or window anchor)."""


@dataclass
class Block:
    """What one block of positions gives: per item, the position after it (``ends``), and the
    items themselves, as a list or (for batches without a transform) as columns."""

    ends: np.ndarray
    items: list[Any] | None = None
    columns: dict[Any, Any] | None = None

    def __len__(self) -> int:
        return len(self.ends)


@dataclass
class BlockReader:
    dataref: DataRef
    fields: tuple[Field, ...]
    predicate: Predicate | None = None
    ngram: NGram | None = None
    anchors: np.ndarray | None = None
    transform: Callable[[Any], Any] | None = None
    as_columns: bool = False

    def __post_init__(self) -> None:
        if self.predicate is not None:
            self._predicate_fields = self.dataref.select(sorted(self.predicate.get_fields()))

    def __call__(self, unit: tuple[int, np.ndarray]) -> Block:
        """``unit`` is (first position, record indices at consecutive positions from it)."""
        start, indices = unit
        ends = np.arange(start + 1, start + 1 + len(indices), dtype=np.int64)
        if self.ngram is not None:
            return self._windows(ends, indices)
        if self.predicate is not None and self.dataref.has_columns(self._predicate_fields):
            # The predicate's fields are whole-chunk columns: only passing records are read.
            tested = self.dataref.read_columns(indices, self._predicate_fields)
            keep = np.flatnonzero(self.predicate.include_batch(tested, len(indices)))
            ends, indices = ends[keep], indices[keep]
            values = self.dataref.read_values(indices)
        else:
            values = self.dataref.read_values(indices)
            if self.predicate is not None:
                tested = self.dataref.layout.decode_columns(values, self._predicate_fields)
                keep = np.flatnonzero(self.predicate.include_batch(tested, len(values)))
                values = [values[j] for j in keep]
                ends, indices = ends[keep], indices[keep]
        if self.as_columns:
            return Block(ends, columns=self.dataref.layout.decode_columns(values, self.fields))
        items = records(self.dataref.layout.decode_columns(values, self.fields), len(values))
        if self.transform is not None:
            items = self._transformed(items, indices)
        return Block(ends, items=items)

    def _windows(self, ends: np.ndarray, positions: np.ndarray) -> Block:
        assert self.ngram is not None and self.anchors is not None
        anchors = self.anchors[positions]
        if self.as_columns:
            return Block(ends, columns=self.ngram.read_batch(self.dataref, anchors))
        windows: list[Any] = self.ngram.read_windows(self.dataref, anchors)
        if self.transform is not None:
            windows = self._transformed(windows, anchors)
        return Block(ends, items=windows)

    def _transformed(self, items: list[Any], indices: np.ndarray) -> list[Any]:
        transform = self.transform
        assert transform is not None
        out = []
        for item, index in zip(items, indices.tolist()):
            try:
                out.append(transform(item))
            except Exception as exc:
                raise TransformError(
                    f"the transform raised on {self._what} {index}: {type(exc).__name__}: {exc}"
                ) from exc
        return out

    # --- naming a block's records in the errors of worker processes (see workers.py) ---

    def describe(self, unit: tuple[int, np.ndarray]) -> str:
        """The positions of ``unit`` and the records (or window anchors) at them."""
        start, indices = unit
        named = ", ".join(
            str(self._record(unit, start + j)) for j in range(min(len(indices), _NAMED))
        )
        more = ", ..." if len(indices) > _NAMED else ""
        return (
            f"positions {start} to {start + len(indices) - 1} of this shard's epoch "
            f"({self._what}s {named}{more})"
        )

    def unpicklable(
        self, unit: tuple[int, np.ndarray], result: Block, error: Exception
    ) -> TransformError:
        """The error for a block that cannot be sent back from a worker process, naming the
        first item that cannot be pickled (a transform's result: decoded values always can)."""
        for item, end in zip(result.items or [], result.ends.tolist()):
            try:
                pickle.dumps(item, pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                error = exc
                where = f"the transform's result for {self._what} {self._record(unit, end - 1)}"
                break
        else:
            where = f"the block of {self.describe(unit)}"
        return TransformError(
            f"{where} cannot be sent back from a worker process ({type(error).__name__}: "
            f"{error}): return picklable values (numbers, strings, numpy arrays, and lists or "
            "dicts of them), or use worker_type='thread'"
        )

    @property
    def _what(self) -> str:
        return "window anchored at record" if self.ngram is not None else "record"

    def _record(self, unit: tuple[int, np.ndarray], position: int) -> int:
        """The record (or window anchor) at ``position``, one of ``unit``'s positions."""
        start, indices = unit
        index = int(indices[position - start])
        return int(self.anchors[index]) if self.anchors is not None else index


def records(columns: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """``n`` records as dicts, from columns (arrays or lists) as decode_columns gives them."""
    names = list(columns)
    values = [list(c) if isinstance(c, np.ndarray) else c for c in columns.values()]
    return [dict(zip(names, row)) for row in zip(*values)] if names else [{} for _ in range(n)]


def collate(items: list[Any]) -> Any:
    """Stack items into a batch: dicts field by field (nested dicts too), equal-shape arrays and
    numbers into arrays, anything else into lists."""
    first = items[0]
    if isinstance(first, dict):
        return {key: collate([item[key] for item in items]) for key in first}
    numeric = isinstance(first, (np.ndarray, np.generic, int, float)) and not isinstance(
        first,
        (str, bytes),  # np.str_ and np.bytes_ are np.generic too
    )
    if numeric and len({np.shape(v) for v in items}) == 1:
        return np.stack([np.asarray(v) for v in items])
    return list(items)
