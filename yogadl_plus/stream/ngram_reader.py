"""Reading n-gram windows from a DataRef: which windows exist (their anchors, computed once
per DataRef and kept while it lives) and the records of the windows at any anchors.

An ``NGram`` (``ngram.py``) says what a window is; this module reads them. Which windows exist
is a pure function of the timestamps: the timestamp field is read once, in blocks, and the
anchors follow from where consecutive gaps exceed the threshold, with no loop over windows.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from yogadl_plus import lifecycle
from yogadl_plus.errors import NGramError, SchemaError

if TYPE_CHECKING:
    from yogadl_plus.cache.fixed import Allocate
    from yogadl_plus.schema import Field, Schema
    from yogadl_plus.streamsource import LeafSource

__all__ = ["WindowSpec", "anchors", "read_batch", "read_windows"]


class WindowSpec(Protocol):
    """What this reader needs of a window's description: ``ydl.NGram`` is one. Declared here,
    not imported, so that ``ngram.py`` (the settings) may hand its reading over to this module
    without the two importing each other."""

    offsets: tuple[int, ...]
    delta_threshold: Any
    timestamp_overlap: bool
    min_offset: int
    span: int

    def check(self, schema: Schema) -> None: ...

    def anchor_key(self) -> tuple[Any, ...]: ...

    def timestamp_name(self, schema: Schema) -> str: ...

    def resolve(self, schema: Schema) -> dict[int, tuple[Field, ...]]: ...

    def window_records(self, anchors: np.ndarray | Sequence[int]) -> np.ndarray: ...

    def iter_assembled(
        self, columns_by_offset: Mapping[int, Mapping[str, Any]], count: int
    ) -> Iterator[dict[int, dict[str, Any]]]: ...


# The anchors of each DataRef, per anchor key: computed once per DataRef object, dropped with it.
_ANCHORS: weakref.WeakKeyDictionary[LeafSource, dict[tuple[Any, ...], np.ndarray]] = (
    weakref.WeakKeyDictionary()
)
_ANCHORS_LOCK = threading.Lock()


def _new_lock_after_fork() -> None:
    global _ANCHORS_LOCK
    _ANCHORS_LOCK = threading.Lock()  # a thread of the parent may have held it


lifecycle.on_fork(after_in_child=_new_lock_after_fork)

# Timestamps read per get_batch call while looking for windows (8 bytes each: 512 KiB).
_TS_BLOCK = 65536


def anchors(ngram: WindowSpec, dataref: LeafSource) -> np.ndarray:
    """The anchors of all of ``ngram``'s windows in ``dataref``, sorted (the greedy set when
    ``timestamp_overlap=False``), as a read-only int64 array.

    Reads the timestamp field of every record once per DataRef object; the result is kept
    as long as the DataRef lives, so the streams of all shards built on one DataRef share
    it. Raises NGramError when timestamps decrease between two records that fall in one
    window.
    """
    # Checked every time: the cache is shared by NGrams that name other fields.
    ngram.check(dataref.schema)
    key = ngram.anchor_key()
    with _ANCHORS_LOCK:
        found = _ANCHORS.setdefault(dataref, {}).get(key)
    if found is None:
        found = _compute_anchors(ngram, dataref, ngram.timestamp_name(dataref.schema))
        found.flags.writeable = False
        with _ANCHORS_LOCK:
            found = _ANCHORS.setdefault(dataref, {}).setdefault(key, found)
    return found


def read_windows(
    ngram: WindowSpec, dataref: LeafSource, anchors: np.ndarray | Sequence[int]
) -> list[dict[int, dict[str, Any]]]:
    """The windows of ``ngram`` at ``anchors``, one ``{offset: {field: value}}`` dict each.

    Each offset's fields are read in one call for all anchors; only the fields named at an
    offset are decoded for it.
    """
    batch = read_batch(ngram, dataref, anchors)
    return list(ngram.iter_assembled(batch, len(anchors)))


def read_batch(
    ngram: WindowSpec,
    dataref: LeafSource,
    anchors: np.ndarray | Sequence[int],
    allocate: Allocate | None = None,
) -> dict[int, dict[str, Any]]:
    """The windows of ``ngram`` at ``anchors`` as one batch ``{offset: {field: stacked}}``,
    every offset of the span in order: arrays for fixed-shape numeric fields, lists for the
    rest (as DataRef.get_batch; ``allocate``: where big arrays are made, as there); ``{}`` at
    an offset not named."""
    records = _checked_records(ngram, dataref, anchors)
    at = dict(zip(ngram.offsets, records.T))  # (the records of the offsets named)
    return {
        offset: dataref.read_columns(at[offset], fields, allocate) if fields else {}
        for offset, fields in ngram.resolve(dataref.schema).items()
    }


# --- the computation ---


def _checked_records(
    ngram: WindowSpec, dataref: LeafSource, anchors: np.ndarray | Sequence[int]
) -> np.ndarray:
    records = ngram.window_records(anchors)
    if records.size:
        low, high = int(records.min()), int(records.max())
        if low < 0 or high >= len(dataref):
            bad = low if low < 0 else high
            raise IndexError(
                f"an n-gram window reaches record {bad}, outside [0, {len(dataref)}): "
                "anchors must come from NGram.anchors()"
            )
    return records


def _timestamp_blocks(dataref: LeafSource, name: str) -> Iterator[np.ndarray]:
    n = len(dataref)
    for start in range(0, n, _TS_BLOCK):
        stop = min(start + _TS_BLOCK, n)
        block = dataref.get_batch(np.arange(start, stop), fields=[name])[name]
        yield np.asarray(block)


def _compute_anchors(ngram: WindowSpec, dataref: LeafSource, timestamp: str) -> np.ndarray:
    n = len(dataref)
    span = ngram.span
    if n < span:
        return np.empty(0, dtype=np.int64)
    if span == 1:
        bad_gaps = np.empty(0, dtype=np.int64)
    else:
        blocks = _timestamp_blocks(dataref, timestamp)
        bad_gaps = _bad_gaps(blocks, ngram.delta_threshold, timestamp)
    starts = _window_starts(bad_gaps, n, span, 1 if ngram.timestamp_overlap else span)
    starts -= ngram.min_offset
    return starts


def _bad_gaps(blocks: Iterator[np.ndarray], delta: Any, timestamp_field: str) -> np.ndarray:
    """Indices g of the gaps between records g and g+1 that exceed the threshold; raises
    NGramError at the first decrease (every gap lies in a window when span <= n)."""
    found: list[np.ndarray] = []
    previous: np.ndarray | None = None  # the last timestamp of the block before
    base = 0  # the record index of ts[0]
    for block in blocks:
        ts = block if previous is None else np.concatenate([previous, block])
        if ts.dtype.kind == "i":
            ts = ts.astype(np.int64, copy=False)  # no overflow in small int gaps
        elif ts.dtype.kind == "u":
            ts = ts.astype(np.uint64, copy=False)
        elif ts.dtype.kind == "f":
            ts = ts.astype(np.float64, copy=False)
        later, earlier = ts[1:], ts[:-1]
        decreasing = np.flatnonzero(later < earlier)
        if decreasing.size:
            k = int(decreasing[0])
            name = timestamp_field
            raise NGramError(
                f"timestamps are not sorted: record {base + k} has {ts[k]}, record "
                f"{base + k + 1} has {ts[k + 1]}; an n-gram window needs its records in "
                f"timestamp order (cache the dataset sorted by {name!r})"
            )
        try:
            # "not <=" so that NaN and NaT gaps count as too large.
            bad = ~((later - earlier) <= delta)
        except TypeError as exc:
            raise SchemaError(
                f"cannot compare gaps of {timestamp_field!r} ({ts.dtype}) with "
                f"delta_threshold {delta!r}: {exc}"
            ) from None
        found.append(np.flatnonzero(bad) + base)
        previous = ts[-1:]
        base += len(ts) - 1
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


def _window_starts(bad_gaps: np.ndarray, n: int, span: int, step: int) -> np.ndarray:
    """First records of the valid windows of ``span`` records among ``n``, every ``step``-th
    of each run of consecutive valid ones.

    A window starting at s is valid if no bad gap g lies in [s, s + span - 2], so the valid
    starts form runs [g_i + 1, g_(i+1) - span + 1] between consecutive bad gaps. Greedy
    non-overlapping selection (step = span) starts each run afresh at its first start: the run
    before ends at g - span + 1 at the latest, so its last window ends before g + 1, the run's
    first start. That makes the greedy choice arithmetic, with no loop over windows.
    """
    bad = bad_gaps.astype(np.int64, copy=False)
    firsts = np.concatenate([[0], bad + 1])
    lasts = np.concatenate([bad - span + 1, [n - span]])
    keep = firsts <= lasts
    firsts, lasts = firsts[keep], lasts[keep]
    counts = (lasts - firsts) // step + 1
    if not counts.size:
        return np.empty(0, dtype=np.int64)
    before = np.cumsum(counts) - counts  # output position of each run's first window
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) * step + np.repeat(firsts - step * before, counts)
