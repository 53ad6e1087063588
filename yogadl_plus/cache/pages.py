"""Where each record's bytes lie in a chunk file, read from LMDB's page structure alone.

Read-ahead needs a record's place in the file before reading it: asking LMDB for the value
(``txn.get``) already reads every page of it, 4 KiB at a time. So the tree is walked here with
plain ``pread``s of its branch and leaf pages (a small share of the file for big records: a
leaf page lists ~150 of them), following LMDB's documented on-disk layout (lmdb.h, mdb.c:
page header, meta page, nodes). This is a hint for the page cache only: records are always
read through LMDB itself and checked as before, so a file this module misreads costs speed,
never data. Anything unexpected makes ``page_map`` return None (no read-ahead for that chunk).
"""

from __future__ import annotations

import os
import struct

import numpy as np

from yogadl_plus.cache.keys import IDENTITY_KEY, KEY_BYTES
from yogadl_plus.cache.lmdbformat import (
    DB,
    DB_OFFSET,
    F_BIGDATA,
    INVALID_PAGE,
    MAGIC,
    META,
    NODE,
    P_BRANCH,
    P_LEAF,
    P_META,
    PAGE_HEADER,
    TXNID_OFFSET,
)
from yogadl_plus.errors import UnexpectedLayout

__all__ = ["PageMap", "page_map"]

# Leaf pages read to map overflow values at most (beyond, whole leaf pages are the spans).
_MAX_LEAF_PAGES = 1 << 14


_IDENTITY = int.from_bytes(IDENTITY_KEY, "big")


class PageMap:
    """``spans(local)``: (file offsets, lengths) holding the given records of one chunk: a
    value on its own pages (big records) where the leaves say so, else its leaf page."""

    def __init__(
        self,
        page_size: int,
        leaf_first: np.ndarray,
        leaf_pgno: np.ndarray,
        values: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        self._page_size = page_size
        self._leaf_first = leaf_first
        self._leaf_pgno = leaf_pgno
        self._values = values

    def spans(self, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._values is not None:
            return self._values[0][local], self._values[1][local]
        leaf = np.searchsorted(self._leaf_first, local, side="right") - 1
        offsets = self._leaf_pgno[leaf] * self._page_size
        return offsets, np.full(len(local), self._page_size, dtype=np.int64)


def page_map(fd: int, records: int) -> PageMap | None:
    """The spans of a chunk's ``records`` records, or None where the file is not as expected."""
    try:
        return _Walk(fd).run(records)
    except (UnexpectedLayout, OSError, struct.error, ValueError, IndexError):
        return None


class _Walk:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.file_pages = 0
        self.page_size = 0

    def read_page(self, pgno: int) -> bytes:
        if not 2 <= pgno < self.file_pages:
            raise UnexpectedLayout(f"page {pgno} outside the file")
        data = os.pread(self.fd, self.page_size, pgno * self.page_size)
        if len(data) != self.page_size:
            raise UnexpectedLayout("short read")
        return data

    def run(self, records: int) -> PageMap:
        first = os.pread(self.fd, 4096, 0)
        self.page_size = DB.unpack_from(first, DB_OFFSET)[0]
        if self.page_size < 512 or self.page_size & (self.page_size - 1):
            raise UnexpectedLayout("page size")
        size = os.fstat(self.fd).st_size
        self.file_pages = size // self.page_size
        metas = [self._meta(os.pread(self.fd, self.page_size, n * self.page_size)) for n in (0, 1)]
        _, root, depth, overflow = max(m for m in metas if m is not None)
        if root == INVALID_PAGE or depth < 1:
            raise UnexpectedLayout("empty tree")
        # Walk the branch levels down to the leaves, in key order.
        # Each level: the first local index under each page, and the page numbers.
        leaf_first, leaf_pgno = np.zeros(1, np.int64), np.array([root], np.int64)
        for _ in range(depth - 1):
            children = [
                self._children(pgno, first)
                for first, pgno in zip(leaf_first.tolist(), leaf_pgno.tolist())
            ]
            leaf_first = np.concatenate([first for first, _ in children])
            leaf_pgno = np.concatenate([pgno for _, pgno in children])
        pages = PageMap(self.page_size, leaf_first, leaf_pgno, None)
        if not overflow or len(leaf_pgno) > _MAX_LEAF_PAGES:
            return pages  # small records: a record's span is its leaf page
        offsets, lengths = pages.spans(np.arange(records))
        for pgno in leaf_pgno.tolist():
            self._leaf_spans(pgno, offsets, lengths)
        return PageMap(self.page_size, leaf_first, leaf_pgno, (offsets, lengths))

    def _meta(self, page: bytes) -> tuple[int, int, int, int] | None:
        if len(page) < PAGE_HEADER + META.size + 2 * DB.size + 16:
            return None
        flags = struct.unpack_from("<H", page, 10)[0]
        magic = META.unpack_from(page, PAGE_HEADER)[0]
        if not flags & P_META or magic != MAGIC:
            raise UnexpectedLayout("not an LMDB meta page")
        main = DB.unpack_from(page, DB_OFFSET + DB.size)
        depth, overflow, root = main[2], main[5], main[7]
        txnid = struct.unpack_from("<Q", page, TXNID_OFFSET)[0]
        return txnid, root, depth, overflow

    def _node_count(self, page: bytes, kind: int) -> int:
        """The number of nodes of a page of ``kind`` (branch or leaf), from its header."""
        flags, lower = struct.unpack_from("<HH", page, 10)
        if not flags & kind:
            raise UnexpectedLayout("page of another kind")
        count = (lower - PAGE_HEADER) >> 1
        if not 0 <= count <= self.page_size // 2:
            raise UnexpectedLayout("node count")
        return int(count)

    def _nodes(self, page: bytes, kind: int) -> list[tuple[int, int, int, bytes, int]]:
        """(lo, hi, flags, key, data offset) of each node of a branch or leaf page."""
        nodes = []
        for i in range(self._node_count(page, kind)):
            at = struct.unpack_from("<H", page, PAGE_HEADER + 2 * i)[0]
            lo, hi, node_flags, key_size = NODE.unpack_from(page, at)
            key = page[at + NODE.size : at + NODE.size + key_size]
            nodes.append((lo, hi, node_flags, key, at + NODE.size + key_size))
        return nodes

    def _children(self, pgno: int, first_key: int) -> tuple[np.ndarray, np.ndarray]:
        """(first record under it, page number) of each child of a branch page whose own first
        record is ``first_key``. Vectorized over the page's nodes: a chunk of small records has
        tens of thousands of leaves, and a node at a time took ~90 ms per 288 MiB chunk."""
        raw = self.read_page(pgno)
        page = np.frombuffer(raw, dtype=np.uint8)
        count = self._node_count(raw, P_BRANCH)
        at = np.frombuffer(raw, dtype="<u2", count=count, offset=PAGE_HEADER).astype(np.int64)
        if count and (at.min() < PAGE_HEADER or at.max() + NODE.size > self.page_size):
            raise UnexpectedLayout("node outside its page")
        words = page[at[:, None] + np.arange(NODE.size)].astype(np.int64)
        lo, hi, node_flags, key_size = (
            words[:, 2 * k] | words[:, 2 * k + 1] << 8 for k in range(4)
        )
        child = lo | hi << 16 | node_flags << 32
        # A record's key is KEY_BYTES big-endian bytes; others (the identity, columns) are not
        # records. The first node's key is implicit: its subtree starts where the page's does.
        is_record = key_size == KEY_BYTES
        if (at[is_record] + NODE.size + KEY_BYTES > self.page_size).any():
            raise UnexpectedLayout("key outside its page")
        keys = page[np.minimum(at[:, None] + NODE.size + np.arange(KEY_BYTES), self.page_size - 1)]
        first = np.zeros(count, dtype=np.int64)
        for byte in range(KEY_BYTES):
            first = first << 8 | keys[:, byte].astype(np.int64)
        is_record &= first != _IDENTITY
        first[0] = first_key
        is_record[0] = True
        return first[is_record], child[is_record]

    def _leaf_spans(self, pgno: int, offsets: np.ndarray, lengths: np.ndarray) -> None:
        page = self.read_page(pgno)
        for lo, hi, flags, key, data_at in self._nodes(page, P_LEAF):
            local = _local(key)
            if local is None or local >= len(offsets) or not flags & F_BIGDATA:
                continue
            value_page = struct.unpack_from("<Q", page, data_at)[0]
            if not 2 <= value_page < self.file_pages:
                raise UnexpectedLayout("overflow page outside the file")
            offsets[local] = value_page * self.page_size + PAGE_HEADER
            lengths[local] = lo | hi << 16


def _local(key: bytes) -> int | None:
    """The record index a key names, None for the identity and column keys."""
    if len(key) != KEY_BYTES or key == IDENTITY_KEY:
        return None
    return int.from_bytes(key, "big")
