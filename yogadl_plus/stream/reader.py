"""The work done at the boundary for one unit of a stream's positions, for any source.

A unit is ``(first position, Placement)``: where each of its positions reads (source.place).
Each leaf (a DataRef) has a ``LeafReader``: read the records (or n-gram windows), drop those the
predicate rejects (decoding only the predicate's fields for them), decode the selected fields of
the rest, run the transform. The ``SourceReader`` runs the leaves' readers for a unit and puts
their items back in position order; leaves stored alike are decoded together, straight into that
order. Readers are picklable, so the same work runs inline, in threads or in worker processes,
and gives the same result.
"""

from __future__ import annotations

import functools
import itertools
import operator
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

from yogadl_plus.augment import RandomMap
from yogadl_plus.columns import columns_nbytes, merge_columns, records, stacking
from yogadl_plus.errors import SchemaError, TransformError
from yogadl_plus.stream import ngram_reader
from yogadl_plus.stream.block import Block, as_items
from yogadl_plus.stream.skips import skipped
from yogadl_plus.stream.stats import (
    DECODING,
    PREDICATES,
    READING,
    TRANSFORMS,
    Work,
    add_work,
    new_work,
)

if TYPE_CHECKING:
    from yogadl_plus.cache.fixed import Allocate, FieldSpans, Values
    from yogadl_plus.ngram import NGram
    from yogadl_plus.order.placement import Placement
    from yogadl_plus.predicates import Predicate
    from yogadl_plus.schema import Field
    from yogadl_plus.stream.settings import BoundarySettings
    from yogadl_plus.streamsource import LeafSource, StreamSource

__all__ = ["LeafReader", "SourceReader", "Unit"]

_NAMED = 8  # records an error message lists for a unit
# (first position, where the unit's positions read)
Unit = tuple[int, "Placement"]


@dataclass
class LeafReader:
    """The boundary's work on one DataRef's records (or windows anchored at them): ``name``
    is the leaf's, for error messages ('' for a stream over the DataRef itself)."""

    dataref: LeafSource
    fields: tuple[Field, ...]
    name: str = ""
    predicate: Predicate | None = None
    ngram: NGram | None = None
    anchors: np.ndarray | None = None
    transform: Callable[[Any], Any] | None = None
    as_columns: bool = False
    allocate: Allocate | None = None
    skip: np.ndarray | None = None  # records never handed out, sorted
    seed: int = 0  # the stream's shuffle seed: a random_map's, where it names none
    # Image fields handed to the transform as their stored bytes (its encoded_fields).
    encoded: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.predicate is not None:
            self._predicate_fields = self.dataref.select(sorted(self.predicate.get_fields()))

    @functools.cached_property
    def _spans(self) -> FieldSpans | None:
        """How ``read_spans`` reads this reader's fields, or None (read the values, decode
        them). Records read plainly (every one, whole) whose fields lie at fixed places in
        their values have each field gathered from the chunk files straight into its array;
        asked of the leaf at the first read (a stream made reads nothing)."""
        plain = self.predicate is None and self.skip is None and self.ngram is None
        return self.dataref.field_spans(self.fields) if plain and not self.encoded else None

    def __call__(self, start: int, indices: np.ndarray, epoch: int | np.ndarray = 0) -> Block:
        """The block of the records (or windows) at ``indices``, at consecutive positions from
        ``start``, read in ``epoch`` (of this leaf's own: one for all, or one each)."""
        ends = np.arange(start + 1, start + 1 + len(indices), dtype=np.int64)
        began = perf_counter()
        if self.ngram is not None:
            block = self._windows(ends, indices, epoch)
            block.work[READING] += perf_counter() - began - block.work[TRANSFORMS]
            return block
        work = new_work()
        spans = self._spans
        # (Into a worker process's ring, ``allocate``, values are decoded as ever.)
        columns = (
            self.dataref.read_spans(indices, spans)
            if spans is not None and self.allocate is None
            else None
        )
        if columns is not None:  # (gathered into their arrays: nothing left to decode)
            read = perf_counter()
            work[READING] += read - began
        else:
            keep, values = self.kept_values(indices, work)
            if keep is not None:
                ends, indices = ends[keep], indices[keep]
                epoch = epoch[keep] if isinstance(epoch, np.ndarray) else epoch
            read = perf_counter()
            work[READING] += read - began - work[PREDICATES]
            columns = self.dataref.layout.decode_columns(
                values, self.fields, self.allocate, self.encoded
            )
        nbytes = columns_nbytes(columns)
        if self.as_columns:
            work[DECODING] += perf_counter() - read
            return Block(ends, columns=columns, work=work, nbytes=nbytes)
        items = records(columns, len(ends))
        decoded = perf_counter()
        work[DECODING] += decoded - read
        if self.transform is not None:
            items = self._transformed(items, indices, epoch)
            work[TRANSFORMS] += perf_counter() - decoded
        return Block(ends, items=items, work=work, nbytes=nbytes)

    def kept_values(
        self, indices: np.ndarray, work: Work | None = None
    ) -> tuple[np.ndarray | None, Values]:
        """The raw values of the records at ``indices`` that are not skipped and that the
        predicate keeps, and which of ``indices`` those are (None: all of them). The
        predicate's seconds (with decoding its fields) are added to ``work``."""
        if self.skip is not None:
            left = np.flatnonzero(~skipped(indices, self.skip))
            if len(left) < len(indices):
                keep, values = self._tested_values(indices[left], work)
                return (left if keep is None else left[keep]), values
        return self._tested_values(indices, work)

    def _tested_values(
        self, indices: np.ndarray, work: Work | None
    ) -> tuple[np.ndarray | None, Values]:
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
        tested = _apart(self.dataref.layout.decode_columns(values, self._predicate_fields), values)
        keep = np.flatnonzero(self.predicate.include_batch(tested, len(values)))
        if work is not None:
            work[PREDICATES] += perf_counter() - began
        return keep, _taken(values, keep)

    def read_ahead(self, indices: np.ndarray, now: bool = False) -> None:
        """The records of these indices will be read soon (``now``: at once;
        ``DataRef.read_ahead``); n-gram windows announce their anchor records."""
        records = self.anchors[indices] if self.anchors is not None else indices
        # (``now`` named only where set: a hint's usual call is of the records alone.)
        if now:
            self.dataref.read_ahead(records, now=True)
        else:
            self.dataref.read_ahead(records)

    def record(self, index: int) -> int:
        """The record (or window anchor) at ``index``."""
        return int(self.anchors[index]) if self.anchors is not None else int(index)

    def named(self, index: int) -> str:
        """How messages that list several leaves' records name the one at ``index``."""
        return f"{self.name}[{self.record(index)}]" if self.name else str(self.record(index))

    @property
    def what(self) -> str:
        """What this reader's items are, in messages."""
        return "window anchored at record" if self.ngram is not None else "record"

    def _windows(self, ends: np.ndarray, positions: np.ndarray, epoch: int | np.ndarray) -> Block:
        assert self.ngram is not None and self.anchors is not None
        anchors = self.anchors[positions]
        if self.as_columns:
            columns = ngram_reader.read_batch(self.ngram, self.dataref, anchors, self.allocate)
            return Block(ends, columns=columns, nbytes=columns_nbytes(columns))
        windows: list[Any] = ngram_reader.read_windows(self.ngram, self.dataref, anchors)
        block = Block(ends, items=windows)
        if self.transform is not None:
            began = perf_counter()
            block.items = self._transformed(windows, positions, epoch)
            block.work[TRANSFORMS] += perf_counter() - began
        return block

    def _transformed(
        self, items: list[Any], indices: np.ndarray, epoch: int | np.ndarray
    ) -> list[Any]:
        transform = self.transform
        assert transform is not None
        seeded = transform.apply if isinstance(transform, RandomMap) else None
        epochs = epoch.tolist() if isinstance(epoch, np.ndarray) else itertools.repeat(epoch)
        out = []
        for item, index, own in zip(items, indices.tolist(), epochs):
            try:
                if seeded is None:
                    out.append(transform(item))
                else:  # its generator: of this record (a window's anchor) in this epoch
                    out.append(seeded(item, self.seed, own, self.record(index), self.name))
            except Exception as exc:
                source = f"source {self.name!r}: " if self.name else ""
                raise TransformError(
                    f"{source}the transform raised on {self.what} {self.record(index)}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        return out


class SourceReader:
    """The boundary's work for a unit of a source's positions: each leaf's records pass that
    leaf's predicate; leaves stored alike are then decoded together, straight into the unit's
    order (one copy); otherwise each leaf's reader decodes and transforms its own, and the items
    are put back in order."""

    def __init__(
        self,
        source: StreamSource,
        boundary: BoundarySettings,
        anchors: np.ndarray | None,
        seed: int = 0,
    ) -> None:
        self.boundary = boundary
        self.readers = _leaf_readers(source, boundary, anchors, seed)
        used = [r for r, leaf in zip(self.readers, source.leaves) if leaf.used]
        # Columns are merged where every leaf gives the same fields; records read record by
        # record may hold different fields per leaf, and come as items.
        shapes = {tuple((f.name, stacking(f)) for f in r.fields) for r in used}
        self._alike = len(shapes) == 1
        # Leaves whose records are laid out the same are decoded as one run of values.
        schemas = {r.dataref.schema for r in used}
        self._one_layout = (
            self._alike and len(schemas) == 1 and boundary.transform is None and anchors is None
        )
        self._decoder = used[0]
        self._as_columns = boundary.as_columns

    def __call__(self, unit: Unit) -> Block:
        start, placement = unit
        single = placement.single
        if single is not None:  # (one leaf serves every position in order: its block is the unit's)
            return self.readers[single[0]](start, single[2], placement.record_epochs(0))
        if self._one_layout:
            return self._decoded_together(start, placement)
        return self._merged(start, placement)

    def decode_into(self, allocate: Allocate | None) -> None:
        """Big decoded arrays are made by ``allocate`` from now on (a worker process's ring,
        which hands them over without a copy); None: as usual."""
        for reader in self.readers:
            reader.allocate = allocate

    def read_ahead(self, placement: Placement, now: bool = False) -> None:
        """Each leaf's records of these positions will be read soon (``now``: at once)."""
        for leaf, _, indices in placement.parts:
            self.readers[leaf].read_ahead(indices, now)

    def _merged(self, start: int, placement: Placement) -> Block:
        parts = []
        for k, (leaf, where, indices) in enumerate(placement.parts):
            block = self.readers[leaf](0, indices, placement.record_epochs(k))
            # The block's ends count its own positions (1 to len): back to the unit's.
            offsets = placement.offsets((leaf, where, indices))
            parts.append((self.readers[leaf].name, offsets[block.ends - 1], block))
        began = perf_counter()
        ends = np.sort(np.concatenate([kept for _, kept, _ in parts]))
        places = [(name, np.searchsorted(ends, kept), block) for name, kept, block in parts]
        ends = ends + start + 1
        work = new_work()
        for _, _, block in parts:
            add_work(work, block.work)
        nbytes = sum(block.nbytes for _, _, block in parts)
        if self._as_columns and self._alike:
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
        merged.work[DECODING] += perf_counter() - began  # putting the leaves' parts in order
        merged.nbytes = nbytes
        return merged

    def _decoded_together(self, start: int, placement: Placement) -> Block:
        began = perf_counter()
        work = new_work()
        kept = []
        runs: list[Values] = []
        for part in placement.parts:
            keep, run = self.readers[part[0]].kept_values(part[2], work)
            offsets = placement.offsets(part)
            kept.append(offsets if keep is None else offsets[keep])
            runs.append(run)
        n = len(placement)
        values, order = _in_position_order(runs, kept, n)
        ends = np.arange(start + 1, start + n + 1) if order is None else order + start + 1
        reader = self._decoder
        read = perf_counter()
        work[READING] += read - began - work[PREDICATES]
        columns = reader.dataref.layout.decode_columns(
            values, reader.fields, reader.allocate, reader.encoded
        )
        block = Block(ends, columns=columns, work=work, nbytes=columns_nbytes(columns))
        if not self._as_columns:
            block = as_items(block)
        work[DECODING] += perf_counter() - read
        return block

    # --- naming a unit's records in the errors of worker processes (see workers/) ---

    def describe(self, unit: Unit) -> str:
        """The positions of ``unit`` and the records (or window anchors) at them."""
        start, placement = unit
        named = sorted(
            (int(offset), self.readers[part[0]].named(int(index)))
            for part in placement.parts
            for offset, index in zip(placement.offsets(part), part[2])
        )
        listed = ", ".join(text for _, text in named[:_NAMED])
        more = ", ..." if len(placement) > _NAMED else ""
        return (
            f"positions {start} to {start + len(placement) - 1} of this shard's epoch "
            f"({self.readers[0].what}s {listed}{more})"
        )

    def unpicklable(self, unit: Unit, result: Block, error: Exception) -> TransformError:
        """The error for a block that cannot be sent back from a worker process, naming the
        first item that cannot be pickled (a transform's result: decoded values always can)."""
        start, placement = unit
        for item, end in zip(result.items or [], result.ends.tolist()):
            try:
                pickle.dumps(item, pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                reader, index = self._at(placement, end - 1 - start)
                where = f"the transform's result for {reader.what} {reader.named(index)}"
                return _not_sent_back(where, exc)
        return _not_sent_back(f"the block of {self.describe(unit)}", error)

    def _at(self, placement: Placement, offset: int) -> tuple[LeafReader, int]:
        """The leaf reader and index of the run's ``offset``."""
        for part in placement.parts:
            offsets = placement.offsets(part)
            found = np.flatnonzero(offsets == offset)
            if found.size:
                return self.readers[part[0]], int(part[2][found[0]])
        raise IndexError(offset)


def _leaf_readers(
    source: StreamSource, boundary: BoundarySettings, anchors: np.ndarray | None, seed: int
) -> list[LeafReader]:
    """A reader per leaf, each with that leaf's fields: those named, or for batches the shared
    ones; records read record by record keep each leaf's own fields."""
    shared = [f.name for f in source.stream_fields(boundary.fields, boundary.batching)]
    skips = boundary.skip.for_source(source) if boundary.skip is not None else None
    encoded = boundary.encoded_fields
    readers = []
    for number, leaf in enumerate(source.leaves):
        if leaf.used:
            _check_leaf(leaf.ref, leaf.name, boundary)
        # (A leaf never read, of weight 0, gets a reader only to hold its place.)
        own = (boundary.fields is None and not boundary.batching) or not leaf.used
        readers.append(
            LeafReader(
                leaf.ref,
                leaf.ref.select(None if own else shared),
                name=leaf.name,
                predicate=boundary.predicate,
                ngram=boundary.ngram,
                anchors=anchors,
                transform=boundary.transform,
                as_columns=boundary.as_columns,
                skip=skips[number] if skips is not None else None,
                seed=seed,
                encoded=encoded & leaf.ref.layout.image_fields if encoded else frozenset(),
            )
        )
    return readers


def _check_leaf(dataref: LeafSource, name: str, boundary: BoundarySettings) -> None:
    """SchemaError for fields the predicate or n-gram names that the leaf lacks."""
    try:
        if boundary.ngram is not None:
            boundary.ngram.check(dataref.schema)
        if boundary.predicate is not None:
            boundary.predicate.check(dataref.schema)
    except SchemaError as exc:
        raise SchemaError(f"source {name!r}: {exc}" if name else str(exc)) from None


def _not_sent_back(where: str, error: Exception) -> TransformError:
    return TransformError(
        f"{where} cannot be sent back from a worker process ({type(error).__name__}: "
        f"{error}): return picklable values (numbers, strings, numpy arrays, and lists or "
        "dicts of them), or use worker_type='thread'"
    )


def _apart(columns: dict[str, Any], values: Values) -> dict[str, Any]:
    """``columns`` with each array that views the gathered rows ``values`` copied: a predicate
    may change what it is given, never the records handed out after it."""
    if not isinstance(values, np.ndarray):
        return columns
    return {
        name: column.copy()
        if isinstance(column, np.ndarray) and np.may_share_memory(column, values)
        else column
        for name, column in columns.items()
    }


def _taken(values: Values, at: np.ndarray) -> Values:
    """The values at positions ``at`` of ``values``, in that order."""
    if isinstance(values, np.ndarray):
        return values[at]
    if len(at) == 1:
        return [values[int(at[0])]]
    return list(operator.itemgetter(*at.tolist())(values)) if len(at) else []


def _in_position_order(
    runs: list[Values], kept: list[np.ndarray], n: int
) -> tuple[Values, np.ndarray | None]:
    """The values of ``runs`` (one per part of a unit of ``n`` positions, read at its offsets
    ``kept``) in position order, and those offsets in order (None: all ``n``, in order). Rows
    gathered for every position are put in place, a scatter per part; other values are sorted
    by position."""
    if len(runs) < 2:
        return (runs[0] if runs else []), (kept[0] if kept else np.zeros(0, np.int64))
    arrays = _rows_alike(runs)
    if arrays is not None and sum(map(len, kept)) == n:
        # Rows as single items of their size: a scatter of one copy per row, where uint8
        # rows would loop over each row's bytes.
        row = np.dtype((np.void, arrays[0].shape[1]))
        rows = np.empty(n, row)
        for run, at in zip(arrays, kept):
            rows[at] = run.view(row)[:, 0]
        return rows.view(np.uint8).reshape(n, row.itemsize), None
    order = np.concatenate(kept)
    if len(order) == n:  # (every position kept: a scatter sorts them)
        by_position = np.empty_like(order)
        by_position[order] = np.arange(n)
        order = np.arange(n)
    else:
        by_position = np.argsort(order, kind="stable")
        order = order[by_position]
    if arrays is not None:
        return np.concatenate(arrays)[by_position], order
    values: list[memoryview | bytes] = []
    for part in runs:
        values += list(part) if isinstance(part, np.ndarray) else part
    return _taken(values, by_position), order


def _rows_alike(runs: list[Values]) -> list[np.ndarray] | None:
    """``runs`` where every one is gathered rows of one size, else None."""
    arrays = [run for run in runs if isinstance(run, np.ndarray)]
    if not runs or len(arrays) < len(runs):
        return None
    width = arrays[0].shape[1]
    return arrays if all(run.shape[1] == width for run in arrays) else None
