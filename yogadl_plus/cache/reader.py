"""Reads record values out of a version's chunk files: one long read transaction per chunk per
thread per process, reopened after fork."""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from typing import Any, cast

import lmdb
import numpy as np

from yogadl_plus.cache.manifest import ChunkInfo, Manifest
from yogadl_plus.cache.writer import column_key, record_key
from yogadl_plus.errors import CacheCorrupted

__all__ = ["ChunkSet"]

# Values come back as memoryviews into the map (the transactions are opened with buffers=True).
Value = memoryview | bytes

_OPEN_SETS: weakref.WeakSet[ChunkSet] = weakref.WeakSet()


class _SharedEnvironments:
    """One LMDB environment per chunk file per process, shared by every ChunkSet reading it.

    LMDB must not open one file twice in a process (py-lmdb refuses it), and two DataRefs of
    one version are common, so environments are shared and counted by the file's identity.
    A set freed by the garbage collector never waits for the lock (the collector can run inside
    ``acquire``, on the thread holding it): its release is queued when the lock is busy.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[tuple[int, int], list[Any]] = {}  # (dev, inode) -> [env, users]
        self.collected: list[tuple[int, int]] = []

    def acquire(self, path: str) -> tuple[tuple[int, int], lmdb.Environment]:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino)
        with self.lock:
            self._release_collected()
            entry = self.entries.get(key)
            if entry is None:
                env = lmdb.open(
                    path, subdir=False, readonly=True, lock=False, readahead=False, max_dbs=0
                )
                entry = self.entries[key] = [env, 0]
            entry[1] += 1
            return key, entry[0]

    def release(self, keys: list[tuple[int, int]]) -> None:
        with self.lock:
            self.collected.extend(keys)
            keys.clear()
            self._release_collected()

    def release_later(self, keys: list[tuple[int, int]]) -> None:
        """For finalizers: release now if the lock is free, else queue (never wait for it)."""
        self.collected.extend(keys)  # atomic under the GIL
        if self.lock.acquire(blocking=False):
            try:
                self._release_collected()
            finally:
                self.lock.release()

    def _release_collected(self) -> None:
        while self.collected:
            key = self.collected.pop()
            entry = self.entries.get(key)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] == 0:
                del self.entries[key]
                entry[0].close()

    def forget(self) -> None:
        """After fork: the parent's handles are not ours to use or close."""
        self.lock = threading.Lock()
        self.entries = {}
        self.collected = []


_ENVIRONMENTS = _SharedEnvironments()


def _forget_handles_after_fork() -> None:
    # LMDB handles must not be used in a child process: each child opens its own.
    _ENVIRONMENTS.forget()
    for chunk_set in list(_OPEN_SETS):
        chunk_set._drop_handles()


os.register_at_fork(after_in_child=_forget_handles_after_fork)


class ChunkSet:
    """The chunk files of one version, read by global record index."""

    def __init__(self, directory: str, manifest: Manifest) -> None:
        self.directory = directory
        self.chunks: list[ChunkInfo] = list(manifest.chunks)
        self.starts = np.cumsum([0] + [c.records for c in self.chunks], dtype=np.int64)
        self.num_records = int(self.starts[-1])
        self._envs: list[lmdb.Environment | None] = [None] * len(self.chunks)
        self._local = threading.local()
        self._lock = threading.Lock()
        # Shared environments this set holds; released on close() or when it is collected.
        self._held: list[tuple[int, int]] = []
        self._finalizer = weakref.finalize(self, _ENVIRONMENTS.release_later, self._held)
        _OPEN_SETS.add(self)

    def _drop_handles(self) -> None:
        self._envs = [None] * len(self.chunks)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._held.clear()

    def close(self) -> None:
        """Let go of this set's LMDB handles; the next read opens them again."""
        with self._lock:
            txns = getattr(self._local, "txns", None) or []
            for txn in txns:
                if txn is not None:
                    txn.abort()
            _ENVIRONMENTS.release(self._held)
            self._envs = [None] * len(self.chunks)
            self._local = threading.local()

    def _env(self, number: int) -> lmdb.Environment:
        env = self._envs[number]
        if env is None:
            with self._lock:
                env = self._envs[number]
                if env is None:
                    env = self._envs[number] = self._open(number)
        return env

    def _open(self, number: int) -> lmdb.Environment:
        info = self.chunks[number]
        path = os.path.join(self.directory, info.file)
        try:
            size = os.path.getsize(path)
        except OSError as exc:
            raise CacheCorrupted(f"chunk {path} is missing ({exc.strerror})") from None
        if size != info.bytes:
            raise CacheCorrupted(
                f"chunk {path} has {size} bytes, the manifest says {info.bytes}; "
                "the version is damaged: delete it and build it again"
            )
        try:
            key, env = _ENVIRONMENTS.acquire(path)
        except lmdb.Error as exc:
            raise CacheCorrupted(f"chunk {path} is not a readable LMDB file: {exc}") from None
        self._held.append(key)
        entries = env.stat()["entries"]
        if entries != info.records + len(info.columns):
            raise CacheCorrupted(
                f"chunk {path} holds {entries} entries, the manifest says {info.records} records "
                f"and {len(info.columns)} columns"
            )
        return env

    def txn(self, number: int) -> lmdb.Transaction:
        """This thread's long-lived read transaction on chunk ``number``."""
        txns = getattr(self._local, "txns", None)
        if txns is None:
            txns = self._local.txns = [None] * len(self.chunks)
        txn = txns[number]
        if txn is None:
            txn = txns[number] = self._env(number).begin(buffers=True)
        return txn

    def columns(self) -> frozenset[str]:
        """Fields that every chunk also holds as a whole column array."""
        if not self.chunks:
            return frozenset()
        return frozenset.intersection(*(frozenset(c.columns) for c in self.chunks))

    def column(self, number: int, name: str, dtype: np.dtype) -> np.ndarray:
        """Chunk ``number``'s column of ``name``: a read-only view into the map, valid while
        this thread's transaction lives (so take what you need from it right away)."""
        views = getattr(self._local, "columns", None)
        if views is None:
            views = self._local.columns = {}
        array = views.get((number, name))
        if array is None:
            data = self.txn(number).get(column_key(name))
            info = self.chunks[number]
            if data is None or len(data) != info.records * dtype.itemsize:
                raise CacheCorrupted(f"chunk {info.file}: column {name!r} is missing or short")
            array = views[(number, name)] = np.frombuffer(data, dtype)
        return array

    def gather(self, name: str, dtype: np.dtype, indices: np.ndarray) -> np.ndarray:
        """Column ``name`` at global record ``indices``, without reading the records."""
        if len(self.chunks) == 1:
            return self.column(0, name, dtype)[indices]
        chunk, local = self.locate(indices)
        out = np.empty(len(indices), dtype)
        for number in np.unique(chunk).tolist():
            here = chunk == number
            out[here] = self.column(number, name, dtype)[local[here]]
        return out

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(chunk number, index inside that chunk) of each global record index."""
        chunk = np.searchsorted(self.starts, indices, side="right") - 1
        return chunk, indices - self.starts[chunk]

    def get(self, index: int) -> memoryview:
        """The value of one record; valid until this thread's transaction ends."""
        if len(self.chunks) == 1:
            number, local = 0, index
        else:
            number = int(np.searchsorted(self.starts, index, side="right")) - 1
            local = index - int(self.starts[number])
        value = self.txn(number).get(local.to_bytes(4, "big"))
        if value is None:
            raise CacheCorrupted(f"record {index} is missing from {self.chunks[number].file}")
        return cast(memoryview, value)

    def get_many(self, indices: np.ndarray) -> list[memoryview]:
        """The values of many records, in the order given."""
        values: list[Value | None]
        n = len(indices)
        if n > 2 and indices[-1] - indices[0] == n - 1 and (np.diff(indices) == 1).all():
            values = self._get_run(int(indices[0]), n)
        elif len(self.chunks) == 1:
            get = self.txn(0).get
            keys = np.asarray(indices, dtype=">u4").tobytes()
            values = [get(keys[j : j + 4]) for j in range(0, len(keys), 4)]
        else:
            chunk, local = self.locate(np.asarray(indices, dtype=np.int64))
            keys = local.astype(">u4").tobytes()
            # Only the chunks this batch touches are opened.
            gets = {int(c): self.txn(int(c)).get for c in np.unique(chunk)}
            values = [gets[c](keys[4 * j : 4 * j + 4]) for j, c in enumerate(chunk.tolist())]
        # all() is the cheap test (a missing value is None); an empty value is falsy too.
        if not all(values) and any(v is None for v in values):
            missing = [int(indices[j]) for j, v in enumerate(values) if v is None]
            raise CacheCorrupted(f"records {missing[:10]} are missing from the chunk files")
        return cast(list[memoryview], values)

    def _get_run(self, start: int, count: int) -> list[Value | None]:
        """The values of records start .. start+count-1, walking a cursor instead of seeking."""
        values: list[Value | None] = []
        stop = start + count
        while start < stop:
            number = int(np.searchsorted(self.starts, start, side="right")) - 1
            take = min(stop, int(self.starts[number + 1])) - start
            run: list[Value | None] = []
            cursor = self.txn(number).cursor()
            if cursor.set_key(record_key(start - int(self.starts[number]))):
                run.extend(itertools.islice(cursor.iternext(keys=False, values=True), take))
            values.extend(run)
            values.extend([None] * (take - len(run)))  # reported as missing by the caller
            start += take
        return values

    def verify(self) -> None:
        """Re-hash every chunk file against the manifest; CacheCorrupted names the first bad one."""
        from yogadl_plus.cache.manifest import check_chunk

        for info in self.chunks:
            check_chunk(os.path.join(self.directory, info.file), info)

    def __len__(self) -> int:
        return self.num_records
