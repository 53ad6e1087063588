"""Reads record values out of a version's chunk files: one long read transaction per chunk per
thread per process, reopened after fork.

Nothing is served from a chunk that was not checked first (see docs/guarantees.md): chunks are
opened and checked by OpenChunks (cache/opening.py). While chunks are open, their files' state
is checked again before a read at least every RECHECK_SECONDS (more rarely when many chunks are
open, so that the checks cost under 5% of the time), and a chunk whose file changed is hashed
again before another record of it is served. Errors LMDB reports become CacheCorrupted, and the
failed transaction is renewed, so later reads of good records go on.

A set made with a ChunkProvider reads on demand (cache/demand.py): a chunk not on disk is
fetched when a read needs it, and chunks it is done with are unmapped and unpinned, so that
the cache they live in stays bounded.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import lmdb
import numpy as np

from yogadl_plus import lifecycle
from yogadl_plus.cache.demand import ChunkProvider, ChunksOnDemand
from yogadl_plus.cache.fixed import Values
from yogadl_plus.cache.integrity import DAMAGED
from yogadl_plus.cache.keys import column_key, record_key, record_keys
from yogadl_plus.cache.manifest import ChunkInfo, Manifest
from yogadl_plus.cache.opening import MAPPED_CHUNKS_KEPT, OpenChunks
from yogadl_plus.cache.pagemap import gather_rows, gather_spans
from yogadl_plus.cache.readahead import ReadAhead
from yogadl_plus.cache.tokencolumns import TokenChunk, TokenField, TokenInfo, read_token_chunk
from yogadl_plus.errors import CacheCorrupted, YogaError

__all__ = ["RECHECK_SECONDS", "ChunkSet", "ChunkTransactions"]

# How often, at most, the files of open chunks are checked again for changes (a stat each).
RECHECK_SECONDS = 0.01
# The checks may take at most 1/_RECHECK_SHARE of the time (many open chunks: checked less often).
_RECHECK_SHARE = 20

# Values come back as memoryviews into the map (the transactions are opened with buffers=True).
Value = memoryview | bytes

# py-lmdb's message for a handle used after its environment was closed (never damage).
_CLOSED = "closed/deleted/dropped"

# LMDB handles must not be used in a child process: each child opens its own (the shared
# table of environments forgets the parent's first, see cache/environments.py).
_OPEN_SETS: lifecycle.Registry[ChunkTransactions] = lifecycle.Registry(
    "chunk sets", after_fork_in_child=lambda chunk_set: chunk_set._drop_handles()
)


class ChunkTransactions:
    """The LMDB handles through which a ChunkSet reads one version's chunk files: each
    thread's long-lived read transaction per chunk (and its views of whole-chunk arrays),
    opened on first use, each chunk checked before; the checks of open chunks' files; and the
    letting go of them all on ``close`` and after a fork.

    ``provider``: where chunks missing from ``directory`` come from (reading on demand).
    """

    def __init__(
        self, directory: str, manifest: Manifest, provider: ChunkProvider | None = None
    ) -> None:
        self.directory = directory
        self.name = f"{manifest.dataset_id}:{manifest.version}"
        self.chunks: list[ChunkInfo] = list(manifest.chunks)
        self.starts = np.cumsum([0] + [c.records for c in self.chunks], dtype=np.int64)
        self.num_records = int(self.starts[-1])
        self._token_fields = TokenField.of_schema(manifest.schema)
        # Per chunk: its descriptor, one while it is read ahead; one per value map kept.
        lifecycle.allow_open_files(2 * len(self.chunks) + min(len(self.chunks), MAPPED_CHUNKS_KEPT))
        self._opened = OpenChunks(directory, manifest)
        # Reading on demand, chunks are opened (and let go of) by the working-set strategy.
        self._demand = ChunksOnDemand(self._opened, provider) if provider is not None else None
        self._open_env = self._opened.env if self._demand is None else self._demand.env
        self._next_check = 0.0
        self._local = threading.local()
        # Threads that have read through this set (their transactions map its files).
        self._readers: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        self._ahead: ReadAhead | None = None
        _OPEN_SETS.add(self)

    def _drop_handles(self) -> None:
        self._opened.forget_after_fork()
        self._local = threading.local()
        self._readers = weakref.WeakSet()
        if self._demand is not None:
            self._demand.forget_after_fork()

    def close(self) -> None:
        """Let go of this set's LMDB handles; the next read opens them again. While other
        threads read through this set, only this thread's transactions go: unmapping the files
        under their reads would crash the process."""
        if self._ahead is not None:
            self._ahead.close()
        with self._opened.lock:
            txns = getattr(self._local, "txns", None) or []
            for txn in txns:
                if txn is not None:
                    txn.abort()
            self._local.txns = None
            self._local.columns = None
            me = threading.current_thread()
            if any(t is not me and t.is_alive() for t in self._readers):
                return
            self._readers = weakref.WeakSet()
            self._opened.let_go_of_all()
            self._local = threading.local()
            if self._demand is not None:
                self._demand.close()

    def open_first(self) -> None:
        """Open (and so check) the first chunk on disk now: a manifest whose schema or chunk
        list does not match the chunks fails here, before anyone reads a field by its name.
        (Chunks a sharded pull left out are skipped.)"""
        for number, info in enumerate(self.chunks):
            if os.path.exists(os.path.join(self.directory, info.file)):
                self._open_env(number)
                return

    def check_files(self) -> None:
        """Raise CacheCorrupted if an open chunk's file changed since it was checked, unless
        it still hashes to the manifest's sha256 (then it is trusted in its new state)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        try:
            self._opened.check_files()
        except CacheCorrupted:
            self._local = threading.local()  # every thread's transactions and column views
            raise
        spent = time.monotonic() - now
        self._next_check = now + max(RECHECK_SECONDS, _RECHECK_SHARE * spent)

    def _failed(self, number: int | None, exc: lmdb.Error, what: str) -> YogaError:
        """A CacheCorrupted for an LMDB error while reading chunk ``number`` (None: one of a
        batch's); this thread's transactions on it are renewed, so reads of good records go on.
        (A read of handles another thread closed is said to be that, not damage.)"""
        self._end_transaction(number)
        if number is not None:
            where = f"chunk {self._opened.where(number)}"
        else:
            where = f"a chunk of {self.name}"
        if _CLOSED in str(exc):
            return YogaError(
                f"{where}: {what} could not be read: another thread closed this DataRef "
                "(ref.close()) while this thread read it. close() lets go of the handles every "
                "thread of the process reads through: call it only once no thread reads"
            )
        return CacheCorrupted(
            f"{where}: LMDB could not read {what} ({type(exc).__name__}: {exc}); {DAMAGED}"
        )

    def _end_transaction(self, number: int | None) -> None:
        """This thread's transaction on chunk ``number`` (None: on every chunk) goes, with its
        column views of the chunk; the next read begins another."""
        txns = getattr(self._local, "txns", None) or []
        numbers = range(len(txns)) if number is None or not txns else (number,)
        for n in numbers:
            txn, txns[n] = txns[n], None
            if txn is not None:
                with contextlib.suppress(lmdb.Error):
                    txn.abort()
        views = getattr(self._local, "columns", None)
        if views:
            for key in [k for k in views if number in (None, k[0])]:
                del views[key]

    def _thread_txns(self) -> list[Any]:
        """This thread's transaction slots, one per chunk."""
        txns = getattr(self._local, "txns", None)
        if txns is None:
            txns = self._local.txns = [None] * len(self.chunks)
            self._readers.add(threading.current_thread())
        return cast(list[Any], txns)

    def _thread_views(self) -> dict[tuple[Any, ...], Any]:
        """This thread's views of whole-chunk columns, by (chunk number, ...): they go with
        its transaction on the chunk."""
        views = getattr(self._local, "columns", None)
        if views is None:
            views = self._local.columns = {}
        return cast(dict[tuple[Any, ...], Any], views)

    def txn(self, number: int) -> lmdb.Transaction:
        """This thread's long-lived read transaction on chunk ``number``."""
        txns = getattr(self._local, "txns", None)
        if txns is None:
            txns = self._thread_txns()
        txn = txns[number]
        if txn is None:
            txn = txns[number] = self._open_env(number).begin(buffers=True)
        return txn


class ChunkSet(ChunkTransactions):
    """The chunk files of one version, read by global record index, and the whole-chunk
    arrays they keep (columns, token columns).

    ``provider``: where chunks missing from ``directory`` come from (reading on demand); then
    every read is bracketed by ``read_begins`` / ``read_ends`` (DataRefOnDemand does it).
    """

    def columns(self) -> frozenset[str]:
        """Fields that every chunk also holds as a whole column array."""
        # Chunks of one build hold the same columns: intersect each distinct list once.
        distinct = [frozenset(names) for names in {c.columns for c in self.chunks}]
        return frozenset.intersection(*distinct) if distinct else frozenset()

    def column(self, number: int, name: str, dtype: np.dtype) -> np.ndarray:
        """Chunk ``number``'s column of ``name``: a read-only view into the map, valid while
        this thread's transaction lives (so take what you need from it right away)."""
        views = self._thread_views()
        array = views.get((number, name))
        if array is None:
            try:
                data = self.txn(number).get(column_key(name))
            except lmdb.Error as exc:
                raise self._failed(number, exc, f"column {name!r}") from None
            info = self.chunks[number]
            if data is None or len(data) != info.records * dtype.itemsize:
                raise CacheCorrupted(
                    f"chunk {self._opened.where(number)}: column {name!r} is missing or short"
                )
            array = views[(number, name)] = np.frombuffer(data, dtype)
        return array

    def token_chunk(self, number: int, field: str) -> TokenChunk:
        """Chunk ``number``'s token column of ``field`` (a token field its manifest entry
        counts): read-only views into the map, valid while this thread's transaction lives,
        checked against the manifest's counts (``read_token_chunk``)."""
        self.check_files()
        views = self._thread_views()
        found = views.get((number, "tokens", field))
        if found is None:
            try:
                info = self.chunks[number]
                found = views[(number, "tokens", field)] = read_token_chunk(
                    self.txn(number).get,
                    self._open_env(number).stat()["psize"],
                    self._token_fields[field],
                    field,
                    TokenInfo(info.bytes, info.records, info.tokens[field]),
                )
            except lmdb.Error as exc:
                raise self._failed(number, exc, f"the token column of {field!r}") from None
            except CacheCorrupted as exc:
                where = self._opened.where(number)
                raise CacheCorrupted(f"chunk {where}: {exc}; {DAMAGED}") from None
        return cast(TokenChunk, found)

    def gather(self, name: str, dtype: np.dtype, indices: np.ndarray) -> np.ndarray:
        """Column ``name`` at global record ``indices``, without reading the records."""
        self.check_files()
        if len(self.chunks) == 1:
            return self.column(0, name, dtype)[indices]
        chunk, local = self.chunk_of(indices)
        out = np.empty(len(indices), dtype)
        for number in _distinct(chunk):
            here = chunk == number
            out[here] = self.column(number, name, dtype)[local[here]]
        return out

    def chunk_of(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(chunk number, index inside that chunk) of each global record index."""
        chunk = np.searchsorted(self.starts, indices, side="right") - 1
        return chunk, indices - self.starts[chunk]

    def get(self, index: int) -> memoryview:
        """The value of one record; valid until this thread's transaction ends."""
        if time.monotonic() >= self._next_check:
            self.check_files()
        if len(self.chunks) == 1:
            number, local = 0, index
        else:
            number = int(np.searchsorted(self.starts, index, side="right")) - 1
            local = index - int(self.starts[number])
        try:
            value = self.txn(number).get(record_key(local))
        except lmdb.Error as exc:
            raise self._failed(number, exc, f"record {index}") from None
        if value is None:
            where = self._opened.where(number)
            raise CacheCorrupted(f"record {index} is missing from chunk {where}")
        return cast(memoryview, value)

    def gather_spans(
        self, indices: np.ndarray, row_bytes: int, spans: Sequence[tuple[int, int]]
    ) -> list[np.ndarray] | None:
        """Per ``(start, width)`` of ``spans``, those bytes of the values of the records at
        ``indices`` (each ``row_bytes`` bytes), gathered from the chunk files into a new array
        of ``width``-byte items (cache/pagemap.py); None where they cannot be (read them with
        ``get_many``)."""
        if not row_bytes or self._demand is not None or not self.chunks:
            return None
        self.check_files()
        if len(self.chunks) == 1:
            chunk, local = None, indices
        else:
            chunk, local = self.chunk_of(np.asarray(indices, np.int64))
        self._thread_txns()  # (a reader of the files: close() in another thread leaves them)
        return gather_spans(chunk, local, row_bytes, spans, self._opened.value_maps)

    def get_many(self, indices: np.ndarray, row_bytes: int = 0) -> Values:
        """The values of many records, in the order given; records of ``row_bytes`` bytes each
        as rows gathered from the chunk files where they can be (cache/pagemap.py)."""
        self.check_files()
        n = len(indices)
        single = len(self.chunks) == 1
        chunk, local = (None, indices) if single else self.chunk_of(np.asarray(indices, np.int64))
        if row_bytes and self._demand is None and self.chunks:
            self._thread_txns()  # (a reader of the files: close() in another thread leaves them)
            rows = gather_rows(chunk, local, row_bytes, self._opened.value_maps)
            if rows is not None:
                return rows
        try:
            if n > 2 and indices[-1] - indices[0] == n - 1 and (np.diff(indices) == 1).all():
                values = self._get_run(int(indices[0]), n)
            elif chunk is None:
                values = list(map(self.txn(0).get, record_keys(local)))
            else:
                # Only the chunks this batch touches are opened.
                gets = {c: self.txn(c).get for c in _distinct(chunk)}
                values = [gets[c](key) for c, key in zip(chunk.tolist(), record_keys(local))]
        except lmdb.Error as exc:
            raise self._failed(None, exc, f"a batch of {n} records") from None
        # all() is the cheap test (a missing value is None); an empty value is falsy too.
        if not all(values) and any(v is None for v in values):
            missing = [int(indices[j]) for j, v in enumerate(values) if v is None]
            raise CacheCorrupted(
                f"records {missing[:10]} of {self.name} are missing from its chunks"
            )
        return cast(list[memoryview], values)

    def _get_run(self, start: int, count: int) -> list[Value | None]:
        """The values of records start .. start+count-1, walking a cursor instead of seeking."""
        values: list[Value | None] = []
        stop = start + count
        while start < stop:
            number = int(np.searchsorted(self.starts, start, side="right")) - 1
            take = min(stop, int(self.starts[number + 1])) - start
            run: list[Value | None] = []
            first = start - int(self.starts[number])
            try:
                cursor = self.txn(number).cursor()
                if cursor.set_key(record_key(first)):
                    run.extend(itertools.islice(cursor.iternext(keys=False, values=True), take))
                    # Keys are unique and sorted: from the first key to the last in ``take``
                    # steps, none was skipped (a record missing would shift the values).
                    if run and cursor.key() != record_key(first + len(run) - 1):
                        raise CacheCorrupted(
                            f"chunk {self._opened.where(number)}: records {start}.."
                            f"{start + take - 1} are not where its keys say; {DAMAGED}"
                        )
            except lmdb.Error as exc:
                raise self._failed(number, exc, f"records {start}..{start + take - 1}") from None
            values.extend(run)
            values.extend([None] * (take - len(run)))  # reported as missing by the caller
            start += take
        return values

    def verify(self, on_chunk: Callable[[ChunkInfo], object] | None = None) -> None:
        """Re-hash every chunk file against the manifest; CacheCorrupted names the first bad one
        by its path. ``on_chunk(info)`` is called after each chunk that matches (progress)."""
        # On demand, each chunk is fetched (and so checked) if it is not here, and pinned
        # while it is hashed.
        pin = self._demand.provider.acquire if self._demand is not None else None
        for number, info in enumerate(self.chunks):
            if not self._opened.verify(number, pin):
                self._local = threading.local()  # the open one is forgotten, and its views
            if on_chunk is not None:
                on_chunk(info)

    def __len__(self) -> int:
        return self.num_records

    def read_begins(self) -> None:
        """The calling thread starts a read through a set reading on demand. Its views of
        earlier reads are dead now (they are valid until the thread's next read), so its
        transactions on retired chunks go, and chunks nobody can reach any more are
        unmapped and unpinned."""
        if self._demand is not None:
            self._demand.read_begins(self._thread_txns(), self._end_transaction)

    def read_ends(self) -> None:
        """The calling thread's read returned (see ``read_begins``)."""
        if self._demand is not None:
            self._demand.read_ends()

    def read_ahead(self, indices: np.ndarray, now: bool = False) -> None:
        """Records at ``indices`` will be read soon (``now``: at once): a hint, returns at
        once, changes nothing that is read. Reading on demand, the chunks they live in that
        are not open are fetched in the background, in the order first needed; from a local
        disk, their pages are asked of the disk (cache/readahead.py), unless they are read at
        once: a hint would give the disk no time, and start the read-ahead's work (the page
        maps of every chunk they touch) while the read waits."""
        if not len(indices) or (now and self._demand is None):
            return
        if self._demand is not None:
            chunk = np.searchsorted(self.starts, np.asarray(indices, np.int64), side="right") - 1
            numbers, first = np.unique(chunk, return_index=True)
            self._demand.read_ahead(numbers[np.argsort(first, kind="stable")].tolist())
            # No page hints here: a chunk just fetched is in memory, and a file descriptor
            # held on a chunk the cache evicts would keep its disk space taken.
            return
        ahead = self._ahead
        if ahead is None:
            with self._opened.lock:
                ahead = self._ahead
                if ahead is None:
                    ahead = self._ahead = ReadAhead(self.directory, self.chunks, self.starts)
        ahead.hint(indices)


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct values, ascending. (np.unique imports numpy.ma on its first call, 17 ms of
    a process's first batch.)"""
    if not len(values):
        return []
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))].tolist()
