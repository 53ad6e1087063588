"""A chunk of equal-size records written as LMDB's own pages, without a put per record.

py-lmdb puts a record in about 0.5 us, whatever its size: for records of a few hundred bytes
that is most of a columnar build. But where every value has one size, the B-tree LMDB makes of
records put in key order with MDB_APPEND is known in advance, page by page (mdb.c, LMDB 0.9,
data format version 1):

- leaf pages filled node by node until the next node does not fit (``mdb_page_split``'s append
  case puts the new node alone on a fresh page); a node is its header, the 4-byte key and the
  value, its size made even; a value too big for a node (``node_max``) lies on overflow pages
  of its own, its node holding their first page number (F_BIGDATA);
- branch levels above, one node per child page, the first node of each page without a key; a
  full branch page given one node more is split as LMDB splits it at its end: the left page
  keeps all but its last node, the right page starts with that one and the new one;
- the free DB empty, and the two meta pages.

So those pages are made here with numpy, a batch of records at a time (at most ``_GROUP_BYTES``
of pages), and written to the file as they come: full leaf pages at once; a value on pages of
its own at once too, straight from the batch, its leaf page's place kept before them and the
leaf page written there once full. Nothing is held between batches but the values of a leaf
page. The branch pages and the meta page are written last.

Why this is safe: the file is a genuine LMDB file. Its meta pages are the ones LMDB wrote when
it created the file; only the second one is given the tree (its root, depth, counts and last
page, transaction 1), as LMDB's first commit would. The chunk writer (cache/writer.py) then
has LMDB open the file itself, which checks the meta page, and compares what LMDB reports of
it (``env.stat()``: depth, pages of each kind, entries) and LMDB's gets of records sampled as
they were written with what was written: on any difference the file is thrown away and the
chunk written again by puts. Everything after that goes through LMDB as for any chunk: the
chunk's other entries are added by an ordinary write transaction, the file is synced, hashed
and stamped, and every reader reads it through LMDB, or through the page map
(cache/pagemap.py), which checks its own walk of the pages against LMDB's gets.
"""

from __future__ import annotations

import dataclasses
import errno
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

from yogadl_plus.cache.keys import KEY_BYTES
from yogadl_plus.cache.lmdbformat import (
    BRANCH_FIRST_NODE,
    DATA_VERSION,
    DB,
    DB_OFFSET,
    LAST_PAGE_OFFSET,
    MAGIC,
    MAPSIZE_OFFSET,
    META,
    META_PAGES,
    NODE,
    P_BRANCH,
    P_LEAF,
    P_META,
    P_OVERFLOW,
    PAGE_HEADER,
    TXNID_OFFSET,
    node_max,
)
from yogadl_plus.errors import UnexpectedLayout, unwritable

__all__ = ["LeafLayout", "PageWriter", "TreeShape", "branch_pages", "leaf_layout"]

_SLOT = 2  # a node's place in its page's index (indx_t)
_PGNO = 8  # pgno_t
# Records whose values are kept as written, to compare with LMDB's gets of them.
_SAMPLE_EVERY = 4099  # (prime: the samples fall at every place in a page)
# Leaf pages made in memory at a time, at most.
_GROUP_BYTES = 32 << 20
_IOV_MAX = 1024  # buffers one pwritev takes (POSIX's least IOV_MAX)
_KEYS = np.dtype(">u4")  # a record's key (keys.record_key)
assert _KEYS.itemsize == KEY_BYTES


def _even(size: int) -> int:
    return size + (size & 1)


@dataclass(frozen=True)
class LeafLayout:
    """How records of ``width``-byte values lie on pages of ``psize`` bytes: ``per_leaf``
    nodes of ``node`` bytes fill a leaf page; each value is on the leaf (``overflow`` 0) or on
    ``overflow`` pages of its own, which follow their leaf page. A leaf page and its overflow
    pages are a unit of ``unit`` pages."""

    psize: int
    width: int
    node: int
    per_leaf: int
    overflow: int

    @property
    def unit(self) -> int:
        return 1 + self.per_leaf * self.overflow

    def value_offsets(self, records: np.ndarray) -> np.ndarray:
        """Where in the file the value of each record (by index) starts."""
        unit, slot = np.divmod(records, self.per_leaf)
        leaf = META_PAGES + unit * self.unit
        if self.overflow:
            return (leaf + 1 + slot * self.overflow) * self.psize + PAGE_HEADER
        return (leaf + 1) * self.psize - (slot + 1) * self.node + NODE.size + KEY_BYTES


def leaf_layout(psize: int, width: int) -> LeafLayout:
    """The layout LMDB gives values of ``width`` bytes, under 4-byte keys, in pages of
    ``psize`` bytes (``mdb_node_add``, ``mdb_leaf_size``)."""
    overflow = 0
    value = width
    if NODE.size + KEY_BYTES + width > node_max(psize):
        overflow = (PAGE_HEADER - 1 + width) // psize + 1  # OVPAGES
        value = _PGNO
    node = _even(NODE.size + KEY_BYTES + value)
    return LeafLayout(psize, width, node, (psize - PAGE_HEADER) // (node + _SLOT), overflow)


def branch_pages(children: int, psize: int) -> list[int]:
    """How many nodes each branch page over ``children`` pages holds, as LMDB splits them when
    pages are appended: a page takes nodes until the next does not fit, then keeps all but its
    last, which starts the next page with the new one (``mdb_page_split``, new index at end)."""
    first = _even(BRANCH_FIRST_NODE) + _SLOT
    other = _even(NODE.size + KEY_BYTES) + _SLOT
    fits = 1 + (psize - PAGE_HEADER - first) // other
    if children <= fits:
        return [children]
    full = -(-(children - fits) // (fits - 1))
    return [fits - 1] * full + [children - full * (fits - 1)]


@dataclass(frozen=True)
class TreeShape:
    """What LMDB's ``env.stat()`` says of the main tree of a file: the same names."""

    psize: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int

    def stat(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class PageWriter:
    """Writes records of ``width`` bytes each, keyed 0, 1, ... in order, as the B-tree pages
    of the LMDB file at ``path``, which LMDB has just created (its two meta pages, nothing
    else). ``add`` writes every full leaf page as it comes, and the pages of their own of
    values too big for a leaf as they come; ``finish`` the rest, the branch pages and the meta
    page, and says what LMDB should find. Samples of the values written are kept in
    ``samples`` (record index: value) for that check. What it holds between calls is at most
    a leaf page's values, whatever the batches: records handed over one at a time cost no
    more than in one batch."""

    def __init__(self, path: str, width: int) -> None:
        self.path = path
        self.width = width
        with open(path, "rb") as f:
            metas = f.read()
        psize = DB.unpack_from(metas, DB_OFFSET)[0] if len(metas) >= DB_OFFSET + DB.size else 0
        if psize < 512 or len(metas) != META_PAGES * psize:
            raise UnexpectedLayout(f"{path}: not a new LMDB file ({len(metas)} bytes)")
        self._meta = bytearray(metas[psize:])  # the page LMDB's first commit would write
        magic, version = META.unpack_from(self._meta, PAGE_HEADER)[:2]
        kind = struct.unpack_from("<H", self._meta, 10)[0]
        root = DB.unpack_from(self._meta, DB_OFFSET + DB.size)[-1]
        if magic != MAGIC or version != DATA_VERSION or kind != P_META or root != 2**64 - 1:
            raise UnexpectedLayout(f"{path}: not a new, empty LMDB 0.9 file")
        self.layout = leaf_layout(psize, width)
        self.records = 0  # records on pages written, or on pages of their own (``overflow``)
        self.samples: dict[int, bytes] = {}
        self._last = (0, b"")  # the last record added, sampled when the tree is finished
        self._carry = np.empty((0, width), np.uint8)  # records short of a full leaf page
        self._pages = META_PAGES  # the next page of the file
        self._leaf = 0  # the leaf page of the values on pages of their own being written
        self._file = open(path, "r+b", buffering=0)  # noqa: SIM115 (closed by finish/close)

    def add(self, data: bytes | memoryview) -> None:
        """Append the records laid end to end in ``data`` (a multiple of ``width`` bytes)."""
        rows = np.frombuffer(data, np.uint8).reshape(-1, self.width)
        if not len(rows):
            return
        first = self.records + len(self._carry)
        for i in range(-first % _SAMPLE_EVERY, len(rows), _SAMPLE_EVERY):
            self.samples[first + i] = rows[i].tobytes()
        self._last = (first + len(rows) - 1, rows[-1].tobytes())
        if self.layout.overflow:
            self._add_spilled(rows)
        else:
            self._add_on_leaves(rows)

    def finish(self, map_size: int) -> TreeShape:
        """Write the last leaf page, the branch pages and the meta page; the file is then an
        LMDB file of the records added, for a map of at least ``map_size`` bytes. Returns the
        tree's shape, as LMDB should report it. The file is closed, written or not."""
        layout = self.layout
        try:
            if len(self._carry):
                self._write_on_leaves(self._carry, len(self._carry))
            spilled = self.records % layout.per_leaf if layout.overflow else 0
            if spilled:
                self._write_leaf(spilled)
            shape, root = self._write_tree()
            if shape.depth:
                self._write_meta(shape, root, map_size)
        finally:
            self.close()
        if self.records:
            self.samples[self._last[0]] = self._last[1]
        return shape

    def close(self) -> None:
        self._file.close()

    def written(self, start: int, stop: int) -> bytes:
        """The values of records ``start .. stop - 1`` as they lie in the file written."""
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            data = np.frombuffer(m, np.uint8)
            at = self.layout.value_offsets(np.arange(start, stop, dtype=np.int64))
            out = data[at[:, None] + np.arange(self.width)].tobytes()
            del data
            return out

    def _write(self, data: bytes | bytearray | memoryview, page: int) -> None:
        """Write ``data`` into the file from the start of page ``page`` on."""
        self._write_parts([data], page)

    def _write_parts(self, parts: list[bytes | bytearray | memoryview], page: int) -> None:
        """Write ``parts``, one after the other, into the file from page ``page`` on."""
        views = [memoryview(part) for part in parts]
        at, i = page * self.layout.psize, 0
        try:
            while i < len(views):
                done = os.pwritev(self._file.fileno(), views[i : i + _IOV_MAX], at)
                at, before = at + done, i
                while i < len(views) and done >= len(views[i]):
                    done -= len(views[i])
                    i += 1
                if done:  # (a write cut short: the rest of that part next)
                    views[i] = views[i][done:]
                elif i == before:  # (nothing written, and no error said why)
                    raise OSError(errno.EIO, "the file took none of the bytes written")
        except OSError as exc:  # a full disk
            raise unwritable(self.path, exc) from None

    def _add_on_leaves(self, rows: np.ndarray) -> None:
        """Write ``rows`` (values that lie on their leaf page) page by page, keeping those
        short of a full page for the next call."""
        per_leaf = self.layout.per_leaf
        if len(self._carry):
            take = min(per_leaf - len(self._carry), len(rows))
            self._carry = np.concatenate([self._carry, rows[:take]])
            rows = rows[take:]
            if len(self._carry) < per_leaf:
                return
            self._write_on_leaves(self._carry, per_leaf)
            self._carry = self._carry[:0]
        step = per_leaf * max(1, _GROUP_BYTES // self.layout.psize)
        whole = len(rows) - len(rows) % per_leaf
        for start in range(0, whole, step):
            self._write_on_leaves(rows[start : min(start + step, whole)], per_leaf)
        self._carry = rows[whole:].copy()

    def _write_on_leaves(self, rows: np.ndarray, per_leaf: int) -> None:
        """Write ``rows`` as the next leaf pages of the file, ``per_leaf`` records each."""
        units = len(rows) // per_leaf
        numbers = self._pages + np.arange(units, dtype=np.int64)
        pages, nodes = self._leaves(numbers, self.records, per_leaf)
        at = NODE.size + KEY_BYTES
        nodes[:, :, at : at + self.width] = rows.reshape(units, per_leaf, self.width)
        self._write(pages.reshape(-1).data, self._pages)
        self._pages += units
        self.records += len(rows)

    def _add_spilled(self, rows: np.ndarray) -> None:
        """Write ``rows`` (values too big for a leaf page) on pages of their own as they come,
        each leaf page's after it: its place is kept, and it is written once full."""
        layout = self.layout
        start = 0
        while start < len(rows):
            room = layout.per_leaf - self.records % layout.per_leaf
            if room == layout.per_leaf:
                self._leaf = self._pages
                self._pages += 1
            stop = min(start + room, len(rows))
            self._write_spilled(rows[start:stop])
            if stop - start == room:
                self._write_leaf(layout.per_leaf)
            start = stop

    def _write_spilled(self, rows: np.ndarray) -> None:
        """Write each of ``rows`` on the next pages of the file, pages of its own: its page
        header, its bytes (not copied) and zeros to the end of its last page."""
        layout = self.layout
        heads = np.zeros((len(rows), PAGE_HEADER), np.uint8)
        numbers = self._pages + np.arange(len(rows), dtype=np.int64) * layout.overflow
        heads[:, :_PGNO] = numbers.astype("<u8").view(np.uint8).reshape(-1, _PGNO)
        heads[:, 10] = P_OVERFLOW
        heads[:, 12:16] = np.frombuffer(struct.pack("<I", layout.overflow), np.uint8)
        rest = bytes(layout.overflow * layout.psize - PAGE_HEADER - layout.width)
        parts: list[bytes | bytearray | memoryview] = []
        for head, row in zip(heads, rows):
            parts += (head.data, row.data, rest)
        self._write_parts(parts, self._pages)
        self._pages += len(rows) * layout.overflow
        self.records += len(rows)

    def _write_leaf(self, count: int) -> None:
        """Write the leaf page of the last ``count`` records, whose values are on pages of
        their own, in its place."""
        page, _ = self._leaves(np.array([self._leaf], np.int64), self.records - count, count)
        self._write(page.reshape(-1).data, self._leaf)

    def _leaves(self, numbers: np.ndarray, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Leaf pages ``numbers`` of ``count`` records each, records ``first`` .. on: the
        pages, and their nodes (``[page, node, byte]``) to put values on the leaf in."""
        layout = self.layout
        units = len(numbers)
        pages = np.zeros((units, layout.psize), np.uint8)
        nodes = _header(pages, numbers, P_LEAF, count, layout.node)
        nodes[:, :, 0:4] = np.frombuffer(struct.pack("<I", layout.width), np.uint8)  # lo, hi
        nodes[:, :, 6] = KEY_BYTES
        keys = np.arange(first, first + units * count, dtype=_KEYS)
        nodes[:, :, NODE.size : NODE.size + KEY_BYTES] = keys.view(np.uint8).reshape(
            units, count, KEY_BYTES
        )
        if layout.overflow:
            nodes[:, :, 4] = 1  # F_BIGDATA: the node holds the first of the value's pages
            spilled = numbers[:, None] + 1 + np.arange(count) * layout.overflow
            at = NODE.size + KEY_BYTES
            nodes[:, :, at : at + _PGNO] = (
                spilled.astype("<u8").view(np.uint8).reshape(units, count, _PGNO)
            )
        return pages, nodes

    def _write_tree(self) -> tuple[TreeShape, int]:
        """Write the branch levels over the leaf pages: the tree's shape, and its root page."""
        layout = self.layout
        leaves = -(-self.records // layout.per_leaf)
        depth, branches, root = 0, 0, 0
        if leaves:
            depth = 1
            starts = np.arange(leaves, dtype=np.int64) * layout.per_leaf
            children = META_PAGES + np.arange(leaves, dtype=np.int64) * layout.unit
            while len(children) > 1:
                children, starts = self._write_branches(children, starts)
                branches += len(children)
                depth += 1
            root = int(children[0])
        overflow = self.records * layout.overflow
        return TreeShape(layout.psize, depth, branches, leaves, overflow, self.records), root

    def _write_meta(self, shape: TreeShape, root: int, map_size: int) -> None:
        """Write the meta page of the tree ``shape`` (rooted at page ``root``) as LMDB's first
        commit would: meta page 1, transaction 1."""
        last = self._pages - 1
        meta = self._meta
        DB.pack_into(meta, DB_OFFSET + DB.size, 0, 0, shape.depth, shape.branch_pages,
                     shape.leaf_pages, shape.overflow_pages, shape.entries, root)  # fmt: skip
        struct.pack_into("<Q", meta, LAST_PAGE_OFFSET, last)
        struct.pack_into("<Q", meta, TXNID_OFFSET, 1)
        struct.pack_into("<Q", meta, MAPSIZE_OFFSET, max(map_size, (last + 1) * shape.psize))
        self._write(meta, page=1)

    def _write_branches(
        self, children: np.ndarray, starts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Write the branch level over pages ``children`` (whose first records are ``starts``):
        returns its pages and their first records."""
        psize = self.layout.psize
        counts = branch_pages(len(children), psize)
        numbers = self._pages + np.arange(len(counts), dtype=np.int64)
        pages = np.zeros((len(counts), psize), np.uint8)
        firsts = np.cumsum([0, *counts[:-1]])
        for page, number, first, count in zip(pages, numbers, firsts, counts):
            _branch_page(page, int(number), children[first : first + count],
                         starts[first : first + count])  # fmt: skip
        self._write(pages.reshape(-1).data, self._pages)
        self._pages += len(counts)
        return numbers, starts[firsts]


def _header(pages: np.ndarray, numbers: np.ndarray, kind: int, count: int, node: int) -> np.ndarray:
    """Fill the header and index of ``pages`` (each ``count`` nodes of ``node`` bytes, laid
    from the page's end down, as LMDB adds them); returns the nodes, ``[page, node, byte]``."""
    psize = pages.shape[1]
    head = np.zeros(PAGE_HEADER + _SLOT * count, np.uint8)
    struct.pack_into("<HHH", head.data, 10, kind, PAGE_HEADER + _SLOT * count, psize - count * node)
    slots = psize - node * np.arange(1, count + 1, dtype=np.int64)
    head[PAGE_HEADER:] = slots.astype("<u2").view(np.uint8)
    pages[:, : len(head)] = head
    pages[:, :8] = numbers.astype("<u8").view(np.uint8).reshape(-1, 8)
    return pages[:, psize - count * node :].reshape(len(pages), count, node)[:, ::-1]


def _branch_page(page: np.ndarray, number: int, children: np.ndarray, starts: np.ndarray) -> None:
    """Fill ``page`` as the branch page ``number`` over ``children``: a node each, holding the
    child's page number and its first key (none for the first node)."""
    psize = len(page)
    first = _even(BRANCH_FIRST_NODE)
    other = _even(NODE.size + KEY_BYTES)
    sizes = np.full(len(children), other, np.int64)
    sizes[0] = first
    ends = psize - np.cumsum(sizes)  # where each node starts, from the page's end down
    lower = PAGE_HEADER + _SLOT * len(children)
    struct.pack_into("<QHHHH", page.data, 0, number, 0, P_BRANCH, lower, int(ends[-1]))
    page[PAGE_HEADER:lower] = ends.astype("<u2").view(np.uint8)
    # A branch node's child page number is its lo, hi and flags words: 6 bytes, little-endian.
    pgno = children.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :6]
    page[ends[:, None] + np.arange(6)] = pgno
    page[ends[1:] + 6] = KEY_BYTES
    keys = starts[1:].astype(_KEYS).view(np.uint8).reshape(-1, KEY_BYTES)
    page[ends[1:, None] + NODE.size + np.arange(KEY_BYTES)] = keys
