"""Batches of equal-size records copied out of a chunk file in one numpy gather.

A get costs about 0.9 us in py-lmdb, whatever the value's size: for records of a few hundred
bytes that is nearly all of a shuffled batch's time. But every value lies at a fixed place in the
chunk file, and a chunk never changes once written (docs/guarantees.md). So on first use the
chunk's B-tree is read once, level by level, with numpy (a few hundredths of a second for a
million records), giving the offset of each record's value in the file; a batch is then one
fancy index over the file mapped read-only, about 13x faster than its gets. A batch of some of
the fields is one fancy index per field, each straight into the field's own array: the bytes
are copied once, with no split of whole rows afterwards.

The pages are read as LMDB 0.9 lays them out (``mdb.c``: ``MDB_meta``, ``MDB_page``,
``MDB_node``; data format version 1). Anything else (another magic, version, page size, byte
order, a DUPSORT tree, an entry or page count that does not match the meta page, a value outside
the file, a key out of place, a sample that differs from LMDB's own get) gives no map, and the
chunk is read by gets as before: a map is an optimisation, never a second source of truth. It is
built only from a file whose state is the one the chunk was checked in.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from yogadl_plus.cache.integrity import FileState
from yogadl_plus.cache.keys import KEY_BYTES
from yogadl_plus.cache.lmdbformat import (
    DATA_VERSION,
    DB,
    DB_OFFSET,
    F_BIGDATA,
    MAGIC,
    NODE,
    P_BRANCH,
    P_LEAF,
    P_LEAF2,
    P_SUBPAGE,
    PAGE_HEADER,
    TXNID_OFFSET,
)
from yogadl_plus.errors import UnexpectedLayout

__all__ = ["ValueMap", "gather_rows", "gather_spans", "map_values"]

# Records whose values a map is checked against LMDB's own gets before it is used.
_SAMPLES = 16
# Deeper than any tree of 2^32 records in pages of 512 bytes: a file claiming more is damaged.
_MAX_DEPTH = 32
# A batch is gathered when it reads at most one chunk for this many records: each chunk costs a
# few numpy calls, each record read by a get about 0.9 us.
_RECORDS_PER_CHUNK = 8


class ValueMap:
    """Where each record of one chunk file lies: ``offsets[i]`` is the first byte of record
    ``i``'s value in the file; every value is ``size`` bytes."""

    def __init__(self, offsets: np.ndarray, size: int, mapped: mmap.mmap) -> None:
        self.offsets = offsets
        self.size = size
        self._mapped = mapped
        # Per width: one item of that many bytes starting at each byte of the mapped file.
        self._items: dict[int, np.ndarray] = {}

    def gather(self, local: np.ndarray) -> np.ndarray:
        """The values of records ``local`` (indices inside the chunk), as rows of a new
        ``(len(local), size)`` uint8 array."""
        return self.gather_span(local, 0, self.size).view(np.uint8).reshape(len(local), self.size)

    def gather_span(self, local: np.ndarray, start: int, width: int) -> np.ndarray:
        """Bytes ``[start, start + width)`` of the values of records ``local``, as a new array
        of ``len(local)`` items of ``width`` bytes: one copy per record, straight out of the
        file's pages."""
        items = self._items.get(width)
        if items is None:
            mapped = self._mapped
            items = np.ndarray(
                (len(mapped) - width + 1,), np.dtype((np.void, width)), mapped, strides=(1,)
            )
            self._items[width] = items  # (a race makes two equal views: harmless)
        return items[self.offsets[local] + start]


def gather_rows(
    chunk: np.ndarray | None,
    local: np.ndarray,
    size: int,
    value_maps: Callable[[list[int]], list[ValueMap | None] | None],
) -> np.ndarray | None:
    """The values of records ``local[i]`` of chunks ``chunk[i]`` (None: all of chunk 0), each
    ``size`` bytes, as the rows of one new uint8 array: one gather per chunk, through
    ``value_maps(numbers)``. None where a chunk has no map of that size, or where the batch
    reads so many chunks that gets cost less."""
    found = gather_spans(chunk, local, size, ((0, size),), value_maps)
    return None if found is None else found[0].view(np.uint8).reshape(len(local), size)


def gather_spans(
    chunk: np.ndarray | None,
    local: np.ndarray,
    size: int,
    spans: Sequence[tuple[int, int]],
    value_maps: Callable[[list[int]], list[ValueMap | None] | None],
) -> list[np.ndarray] | None:
    """Per ``(start, width)`` of ``spans``: bytes ``[start, start + width)`` of the values of
    records ``local[i]`` of chunks ``chunk[i]`` (None: all of chunk 0), each value ``size``
    bytes, as a new array of ``width``-byte items in the records' order. So each field is
    copied straight into its own array: one gather per span and chunk. None as for
    ``gather_rows``."""
    if chunk is None:
        maps = value_maps([0])
        if maps is None or maps[0] is None or maps[0].size != size:
            return None
        only = maps[0]
        return [only.gather_span(local, start, width) for start, width in spans]
    if not len(local):
        return [np.empty(0, np.dtype((np.void, width))) for _, width in spans]
    by_chunk = np.argsort(chunk, kind="stable")  # each chunk's records in a run
    ordered = chunk[by_chunk]
    firsts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    if len(firsts) * _RECORDS_PER_CHUNK > len(local):  # (so many chunks that gets cost less)
        return None
    maps = value_maps(ordered[firsts].tolist())
    if maps is None or any(m is None or m.size != size for m in maps):
        return None
    if len(maps) == 1:
        one = cast(ValueMap, maps[0])
        return [one.gather_span(local, start, width) for start, width in spans]
    out = [np.empty(len(local), np.dtype((np.void, width))) for _, width in spans]
    for found, first, stop in zip(maps, firsts.tolist(), [*firsts[1:].tolist(), len(local)]):
        at = by_chunk[first:stop]
        here = local[at]
        for column, (start, width) in zip(out, spans):
            column[at] = cast(ValueMap, found).gather_span(here, start, width)
    return out


def map_values(path: str, state: FileState, records: int, get: Any) -> ValueMap | None:
    """The map of records ``0 .. records-1`` of the chunk file at ``path``, whose values must
    all have one size, or None where it cannot be made (the chunk is then read by gets).
    ``state``: the file's state when the chunk was checked (a file in another state is not
    mapped); ``get(i)``: LMDB's value of record i, for a sample checked against the map."""
    with open(path, "rb") as f:  # (an OSError: no map this time; the caller tries again)
        st = os.fstat(f.fileno())
        now = FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if now != state or st.st_size == 0:
            return None
        # (The map keeps a descriptor of its own: ChunkSet allows one per map kept.)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_RANDOM"):  # as LMDB's own maps: no read-ahead around a gather
        mapped.madvise(mmap.MADV_RANDOM)
    try:
        offsets, sizes = _record_values(mapped, records)
    except (UnexpectedLayout, IndexError, ValueError, struct.error, MemoryError):
        return None
    if records == 0:
        return None
    size = int(sizes[0])
    if size == 0 or (sizes != size).any():
        return None
    value_map = ValueMap(offsets, size, mapped)
    sample = np.unique(np.linspace(0, records - 1, _SAMPLES).astype(np.int64))
    gathered = value_map.gather(sample)
    for row, i in zip(gathered, sample.tolist()):
        value = get(i)
        if value is None or bytes(value) != row.tobytes():
            return None
    return value_map


def _record_values(mapped: mmap.mmap, records: int) -> tuple[np.ndarray, np.ndarray]:
    """(offset, size) of the values of records ``0 .. records-1``, walking the main B-tree
    from the root named by the newer meta page."""
    data = np.frombuffer(mapped, np.uint8)
    words = np.frombuffer(mapped, "<u2", len(mapped) // 2)
    psize = DB.unpack_from(mapped, DB_OFFSET)[0]
    if psize < 512 or psize & (psize - 1) or 2 * psize > len(mapped):
        raise UnexpectedLayout(f"page size {psize}")
    txnids = [struct.unpack_from("<Q", mapped, p * psize + TXNID_OFFSET)[0] for p in (0, 1)]
    meta = psize if txnids[1] > txnids[0] else 0
    magic, version = struct.unpack_from("<II", mapped, meta + PAGE_HEADER)
    if magic != MAGIC or version != DATA_VERSION:
        raise UnexpectedLayout("not an LMDB 0.9 file of this byte order")
    _, db_flags, depth, *counted, root = DB.unpack_from(mapped, meta + DB_OFFSET + DB.size)
    if db_flags or depth < 1:
        raise UnexpectedLayout("a tree with flags, or empty")
    stated = tuple(counted)  # branch, leaf, overflow pages, entries
    if depth > _MAX_DEPTH:
        raise UnexpectedLayout(f"a tree {depth} levels deep")
    pages = np.array([root], np.int64)
    branch_pages = 0
    for _ in range(depth - 1):
        nodes = _nodes(words, pages, psize, P_BRANCH)
        branch_pages += len(pages)
        # A branch node's data is its child's page number, in the node's first 6 bytes.
        pages = _u16(words, nodes) | _u16(words, nodes + 2) << 16 | _u16(words, nodes + 4) << 32
        if branch_pages > stated[0] or len(pages) > stated[0] + stated[1]:
            raise UnexpectedLayout("more pages in the tree than the meta page counts")
    nodes = _nodes(words, pages, psize, P_LEAF)
    sizes = _u16(words, nodes) | _u16(words, nodes + 2) << 16
    flags = _u16(words, nodes + 4)
    key_sizes = _u16(words, nodes + 6)
    values = nodes + NODE.size + key_sizes
    big = (flags & F_BIGDATA) != 0
    if big.any():
        at = values[big]
        pgno = sum(data[at + k].astype(np.uint64) << np.uint64(8 * k) for k in range(8))
        if (pgno < 2).any() or (pgno >= len(mapped) // psize).any():  # (before multiplying)
            raise UnexpectedLayout("an overflow page outside the file")
        values[big] = pgno.astype(np.int64) * psize + PAGE_HEADER
    overflow_pages = int((((PAGE_HEADER - 1) + sizes[big]) // psize + 1).sum())
    counts = (branch_pages, len(pages), overflow_pages, len(nodes))
    if counts != stated:
        raise UnexpectedLayout(f"counted {counts}, the meta page says {stated}")
    if len(nodes) < records or (flags[:records] & ~F_BIGDATA).any():
        raise UnexpectedLayout("records missing, or nodes of other kinds")
    if (key_sizes[:records] != KEY_BYTES).any():
        raise UnexpectedLayout("keys of another size")
    keys = nodes[:records, None] + NODE.size + np.arange(KEY_BYTES)
    numbers = (data[keys].astype(np.int64) << (8 * np.arange(KEY_BYTES - 1, -1, -1))).sum(1)
    if (numbers != np.arange(records)).any():
        raise UnexpectedLayout("record keys out of place")
    offsets, sizes = values[:records], sizes[:records]
    if (offsets < 0).any() or (offsets + sizes > len(mapped)).any():
        raise UnexpectedLayout("a value outside the file")
    # (Half the memory in files under 4 GiB: a million records' offsets take 4 MB.)
    return offsets.astype(np.uint32 if len(mapped) < 1 << 32 else np.int64), sizes


def _nodes(words: np.ndarray, pages: np.ndarray, psize: int, kind: int) -> np.ndarray:
    """The byte offsets in the file of the nodes of ``pages`` (all of ``kind``), in order."""
    if (pages < 2).any() or (pages >= 2 * len(words) // psize).any():  # (before multiplying)
        raise UnexpectedLayout("a page outside the file")
    starts = pages * psize
    flags = _u16(words, starts + 10)
    if ((flags & (P_BRANCH | P_LEAF | P_LEAF2 | P_SUBPAGE)) != kind).any():
        raise UnexpectedLayout("a page of another kind than its level")
    counts = (_u16(words, starts + 12) - PAGE_HEADER) >> 1
    if (counts < 1).any():
        raise UnexpectedLayout("an empty page")
    page_of = np.repeat(starts, counts)
    slot = np.arange(len(page_of)) - np.repeat(np.cumsum(counts) - counts, counts)
    offsets = _u16(words, page_of + PAGE_HEADER + 2 * slot)
    inside = (offsets >= PAGE_HEADER) & (offsets <= psize - NODE.size) & (offsets % 2 == 0)
    if not inside.all():
        raise UnexpectedLayout("a node outside its page")
    return page_of + offsets


def _u16(words: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian 16-bit words at even byte offsets ``at``, as int64."""
    return words[at >> 1].astype(np.int64)
