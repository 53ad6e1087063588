"""The work done at the boundary for one block of a stream's positions.

Read the records (or n-gram windows) at those positions, drop those the predicate rejects
(decoding only the predicate's fields for them), decode the selected fields of the rest, run
the transform. A BlockReader is picklable, so the same work runs inline, in threads or in
worker processes, and gives the same result.
"""

from __future__ import annotations

import dataclasses
import operator
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

from yogadl_plus.errors import SchemaError, TransformError
from yogadl_plus.stream_stats import (
    DECODING,
    PREDICATES,
    READING,
    TRANSFORMS,
    Work,
    add_work,
    new_work,
)

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef
    from yogadl_plus.mixture import Mixture
    from yogadl_plus.ngram import NGram
    from yogadl_plus.predicates import Predicate
    from yogadl_plus.schema import Field

__all__ = [
    "Block",
    "BlockReader",
    "Located",
    "MixtureReader",
    "TransformError",
    "as_items",
    "collate",
    "merge_columns",
    "records",
    "stacking",
]

_NAMED = 8  # records an error message lists for a block


@dataclass
class Block:
    """What one block of positions gives: per item, the position after it (``ends``), and the
    items themselves, as a list or (for batches without a transform) as columns; with the
    seconds reading it took (``work``, by kind: stream_stats.WORK) and the bytes it decoded."""

    ends: np.ndarray
    items: list[Any] | None = None
    columns: dict[Any, Any] | None = None
    work: Work = dataclasses.field(default_factory=new_work)
    nbytes: int = 0

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
        began = perf_counter()
        if self.ngram is not None:
            block = self._windows(ends, indices)
            block.work[READING] += perf_counter() - began - block.work[TRANSFORMS]
            return block
        work = new_work()
        keep, values = self.kept_values(indices, work)
        if keep is not None:
            ends, indices = ends[keep], indices[keep]
        read = perf_counter()
        work[READING] += read - began - work[PREDICATES]
        columns = self.dataref.layout.decode_columns(values, self.fields)
        nbytes = columns_nbytes(columns)
        if self.as_columns:
            work[DECODING] += perf_counter() - read
            return Block(ends, columns=columns, work=work, nbytes=nbytes)
        items = records(columns, len(values))
        decoded = perf_counter()
        work[DECODING] += decoded - read
        if self.transform is not None:
            items = self._transformed(items, indices)
            work[TRANSFORMS] += perf_counter() - decoded
        return Block(ends, items=items, work=work, nbytes=nbytes)

    def kept_values(
        self, indices: np.ndarray, work: Work | None = None
    ) -> tuple[np.ndarray | None, list[memoryview]]:
        """The raw values of the records at ``indices`` that the predicate keeps, and which of
        ``indices`` those are (None: all of them). The predicate's seconds (with decoding its
        fields) are added to ``work``."""
        if self.predicate is None:
            return None, self.dataref.read_values(indices)
        if self.dataref.has_columns(self._predicate_fields):
            # The predicate's fields are whole-chunk columns: only passing records are read.
            tested = self.dataref.read_columns(indices, self._predicate_fields)
            began = perf_counter()
            keep = np.flatnonzero(self.predicate.include_batch(tested, len(indices)))
            if work is not None:
                work[PREDICATES] += perf_counter() - began
            return keep, self.dataref.read_values(indices[keep])
        values = self.dataref.read_values(indices)
        began = perf_counter()
        tested = self.dataref.layout.decode_columns(values, self._predicate_fields)
        keep = np.flatnonzero(self.predicate.include_batch(tested, len(values)))
        if work is not None:
            work[PREDICATES] += perf_counter() - began
        return keep, [values[j] for j in keep]

    def read_ahead(self, indices: np.ndarray) -> None:
        """The records of these positions' indices will be read soon (``DataRef.read_ahead``);
        n-gram windows announce their anchor records."""
        self.dataref.read_ahead(self.anchors[indices] if self.anchors is not None else indices)

    @property
    def datarefs(self) -> tuple[DataRef, ...]:
        """The DataRefs this reader reads (a worker process has them decode into its ring)."""
        return (self.dataref,)

    def _windows(self, ends: np.ndarray, positions: np.ndarray) -> Block:
        assert self.ngram is not None and self.anchors is not None
        anchors = self.anchors[positions]
        if self.as_columns:
            columns = self.ngram.read_batch(self.dataref, anchors)
            return Block(ends, columns=columns, nbytes=columns_nbytes(columns))
        windows: list[Any] = self.ngram.read_windows(self.dataref, anchors)
        block = Block(ends, items=windows)
        if self.transform is not None:
            began = perf_counter()
            block.items = self._transformed(windows, anchors)
            block.work[TRANSFORMS] += perf_counter() - began
        return block

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
        return _not_sent_back(where, error)

    @property
    def _what(self) -> str:
        return "window anchored at record" if self.ngram is not None else "record"

    def _record(self, unit: tuple[int, np.ndarray], position: int) -> int:
        """The record (or window anchor) at ``position``, one of ``unit``'s positions."""
        start, indices = unit
        index = int(indices[position - start])
        return int(self.anchors[index]) if self.anchors is not None else index


@dataclass
class MixtureReader:
    """The boundary's work for a block of a mixture's positions, given where they read
    (``Located``: per source, which positions and which of its records). Each source's records
    pass that source's predicate; sources stored alike are then decoded together, straight into
    the block's order (one copy, as for one DataRef); otherwise each source's reader decodes
    and transforms its own, and the items are put back in order."""

    mixture: Mixture
    readers: list[BlockReader]  # one per leaf of the mixture, in its order
    as_columns: bool

    def __post_init__(self) -> None:
        # Columns are merged where every source gives the same fields; records read record by
        # record may hold different fields per source, and come as items.
        used = [r for r, leaf in zip(self.readers, self.mixture.leaves) if leaf.used]
        shapes = {tuple((f.name, stacking(f)) for f in r.fields) for r in used}
        self._alike = len(shapes) == 1
        # Sources whose records are laid out the same are decoded as one run of values.
        schemas = {r.dataref.schema for r in used}
        self._one_layout = self._alike and len(schemas) == 1 and used[0].transform is None
        self._decoder = used[0]

    def __call__(self, unit: tuple[int, Located]) -> Block:
        start, located = unit
        if self._one_layout:
            return self._decoded_together(start, located)
        parts = []
        for leaf, where, records in located.parts:
            try:
                block = self.readers[leaf]((0, records))
            except TransformError as exc:
                name = self.mixture.leaves[leaf].name
                raise TransformError(f"source {name!r}: {exc}") from exc.__cause__
            # The block's ends count its own positions (1 to len): back to the unit's.
            parts.append((self.mixture.leaves[leaf].name, where[block.ends - 1], block))
        began = perf_counter()
        ends = np.sort(np.concatenate([kept for _, kept, _ in parts]))
        places = [(name, np.searchsorted(ends, kept), block) for name, kept, block in parts]
        ends = ends + start + 1
        work = new_work()
        for _, _, block in parts:
            add_work(work, block.work)
        nbytes = sum(block.nbytes for _, _, block in parts)
        if self.as_columns and self._alike:
            columns = [(name, at, block.columns or {}) for name, at, block in places]
            merged = Block(ends, columns=merge_columns(columns, len(ends)), work=work)
        else:
            items: list[Any] = [None] * len(ends)
            for _, at, block in places:
                block_items = as_items(block).items
                assert block_items is not None
                for place, item in zip(at.tolist(), block_items):
                    items[place] = item
            merged = Block(ends, items=items, work=work)
        merged.work[DECODING] += perf_counter() - began  # putting the sources' parts in order
        merged.nbytes = nbytes
        return merged

    def _decoded_together(self, start: int, located: Located) -> Block:
        began = perf_counter()
        work = new_work()
        kept = []
        values: list[memoryview] = []
        for leaf, where, indices in located.parts:
            keep, run = self.readers[leaf].kept_values(indices, work)
            kept.append(where if keep is None else where[keep])
            values += run
        order = np.concatenate(kept) if kept else np.zeros(0, np.int64)
        if len(located.parts) > 1:
            by_position = np.argsort(order, kind="stable")
            order = order[by_position]
            values = (
                list(operator.itemgetter(*by_position.tolist())(values))
                if len(values) > 1
                else values
            )
        ends = order + start + 1
        reader = self._decoder
        read = perf_counter()
        work[READING] += read - began - work[PREDICATES]
        columns = reader.dataref.layout.decode_columns(values, reader.fields)
        block = Block(ends, columns=columns, work=work, nbytes=columns_nbytes(columns))
        if not self.as_columns:
            block = as_items(block)
        work[DECODING] += perf_counter() - read
        return block

    def read_ahead(self, located: Located) -> None:
        """Each source's records of these positions will be read soon."""
        for leaf, _, records in located.parts:
            self.readers[leaf].read_ahead(records)

    @property
    def datarefs(self) -> tuple[DataRef, ...]:
        return tuple(leaf.ref for leaf in self.mixture.leaves)

    def describe(self, unit: tuple[int, Located]) -> str:
        """The positions of ``unit`` and the sources' records at them."""
        start, located = unit
        named = []
        for leaf, where, records in located.parts:
            name = self.mixture.leaves[leaf].name
            named += [(int(w), f"{name}[{int(r)}]") for w, r in zip(where, records)]
        listed = ", ".join(text for _, text in sorted(named)[:_NAMED])
        more = ", ..." if len(located) > _NAMED else ""
        return (
            f"positions {start} to {start + len(located) - 1} of this shard's epoch "
            f"(records {listed}{more})"
        )

    def unpicklable(
        self, unit: tuple[int, Located], result: Block, error: Exception
    ) -> TransformError:
        """The error for a block that cannot be sent back from a worker process."""
        return _not_sent_back(f"the block of {self.describe(unit)}", error)


def _not_sent_back(where: str, error: Exception) -> TransformError:
    return TransformError(
        f"{where} cannot be sent back from a worker process ({type(error).__name__}: "
        f"{error}): return picklable values (numbers, strings, numpy arrays, and lists or "
        "dicts of them), or use worker_type='thread'"
    )


@dataclass
class Located:
    """Where a run of consecutive positions of a mixture read: per source (leaf number), the
    positions (offsets in the run, ascending) and that source's record at each."""

    length: int
    parts: list[tuple[int, np.ndarray, np.ndarray]]

    def __len__(self) -> int:
        return self.length

    def split(self, step: int) -> list[Located]:
        """This run cut into runs of ``step`` positions (the last may be shorter)."""
        starts = list(range(0, self.length, step))
        cuts = [
            (leaf, where, records, np.searchsorted(where, [*starts, self.length]).tolist())
            for leaf, where, records in self.parts
        ]
        runs = []
        for k, start in enumerate(starts):
            parts = [
                (leaf, where[at[k] : at[k + 1]] - start, records[at[k] : at[k + 1]])
                for leaf, where, records, at in cuts
                if at[k + 1] > at[k]
            ]
            runs.append(Located(min(step, self.length - start), parts))
        return runs

    def __getitem__(self, run: slice) -> Located:
        """The positions [start, stop) of this run, as a run of their own (as for arrays)."""
        start, stop, _ = run.indices(self.length)
        parts = []
        for leaf, where, records in self.parts:
            low, high = np.searchsorted(where, (start, stop)).tolist()
            if high > low:
                parts.append((leaf, where[low:high] - start, records[low:high]))
        return Located(stop - start, parts)


def stacking(field: Field) -> tuple[Any, ...]:
    """What decides how a field's values stack in a batch: fields alike in this are batched
    together from different sources."""
    return (field.kind, field.dtype_name, field.shape, field.nullable)


def columns_nbytes(columns: Mapping[Any, Any]) -> int:
    """The bytes of a block's decoded values: arrays, lists of arrays (variable shapes), of
    str (their length) and bytes, and nested columns (n-gram windows)."""
    total = 0
    for column in columns.values():
        if isinstance(column, np.ndarray):
            total += column.nbytes
        elif isinstance(column, Mapping):
            total += columns_nbytes(column)
        elif isinstance(column, list) and column:
            if isinstance(column[0], np.ndarray):
                total += sum(value.nbytes for value in column)
            elif isinstance(column[0], (str, bytes)):
                total += sum(map(len, column))
    return total


def as_items(block: Block) -> Block:
    """A block of records as a list of record dicts (a reader may give them as columns)."""
    if block.columns is None:
        return block
    items = records(block.columns, len(block))
    return Block(block.ends, items=items, work=block.work, nbytes=block.nbytes)


def merge_columns(
    parts: Sequence[tuple[str, np.ndarray, Mapping[str, Any]]], n: int
) -> dict[str, Any]:
    """Columns of ``n`` items from parts (source name, the items' places, their columns):
    each field's arrays (or lists) put in place. A field that some part lacks, or that comes
    as arrays of different shapes or types, is a SchemaError naming it and the sources."""
    first_name, _, first = parts[0]
    out: dict[str, Any] = {}
    for field, column in first.items():
        stacked = isinstance(column, np.ndarray)
        if stacked:
            merged: Any = np.empty((n, *column.shape[1:]), dtype=column.dtype)
        else:
            merged = [None] * n
        for name, where, columns in parts:
            part = columns.get(field)
            if part is None and field not in columns:
                raise SchemaError(
                    f"field {field!r} is in source {first_name!r} but not in source {name!r}"
                )
            if stacked:
                if (
                    not isinstance(part, np.ndarray)
                    or part.shape[1:] != column.shape[1:]
                    or (part.dtype != column.dtype)
                ):
                    raise SchemaError(
                        f"field {field!r} differs between sources {first_name!r} and {name!r}: "
                        "batches of a mixture need it alike in every source"
                    )
                merged[where] = part
            else:
                for place, value in zip(where.tolist(), list(part or ())):
                    merged[place] = value
        out[field] = merged
    return out


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
