"""Reads record values out of a version's chunk files: one long read transaction per chunk per
thread per process, reopened after fork.

Nothing is served from a chunk that was not checked first (see docs/guarantees.md). Opening a
chunk checks its size, its contents (sha256 against the manifest, or a stamp of an earlier
check of this very file: cache/integrity.py), and its identity (the id, counts and schema digest
the chunk holds, against the manifest). While chunks are open, their files' state is checked
again before a read at least every RECHECK_SECONDS (more rarely when many chunks are open, so
that the checks cost under 5% of the time), and a chunk whose file changed is hashed again
before another record of it is served. Errors LMDB reports become CacheCorrupted, and the
failed transaction is renewed, so later reads of good records go on.

A set made with a ChunkSource reads on demand (cache/demand.py): a chunk not on disk is
fetched when a read needs it, and chunks it is done with are unmapped and unpinned, so that
the cache they live in stays bounded.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, cast

import lmdb
import numpy as np

from yogadl_plus import lifecycle
from yogadl_plus.cache.demand import ChunkSource, Retired, WorkingSet
from yogadl_plus.cache.integrity import (
    DAMAGED,
    FileState,
    file_state,
    same_bytes,
    trusted,
    verify_and_stamp,
)
from yogadl_plus.cache.keys import IDENTITY_KEY, column_key, record_key, record_keys
from yogadl_plus.cache.manifest import ChunkInfo, Manifest, schema_digest
from yogadl_plus.cache.readahead import ReadAhead
from yogadl_plus.cache.writer import chunk_identity
from yogadl_plus.errors import CacheCorrupted, YogaError, unreadable

__all__ = ["RECHECK_SECONDS", "ChunkSet"]

# How often, at most, the files of open chunks are checked again for changes (a stat each).
RECHECK_SECONDS = 0.01
# The checks may take at most 1/_RECHECK_SHARE of the time (many open chunks: checked less often).
_RECHECK_SHARE = 20

# Values come back as memoryviews into the map (the transactions are opened with buffers=True).
Value = memoryview | bytes


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
# What LMDB says when opening a chunk fails for the process's sake, not the file's.
_OS_REASONS = {
    os.strerror(code): code
    for code in (errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE, errno.ENFILE)
}


# py-lmdb's message for a handle used after its environment was closed (never damage).
_CLOSED = "closed/deleted/dropped"


def _os_error(exc: lmdb.Error) -> OSError | None:
    for text, code in _OS_REASONS.items():
        if text in str(exc):
            return OSError(code, text)
    return None


# LMDB handles must not be used in a child process: each child opens its own. The shared
# table forgets its environments first, then every set its own handles.
lifecycle.on_fork(after_in_child=_ENVIRONMENTS.forget)
_OPEN_SETS: lifecycle.Registry[ChunkSet] = lifecycle.Registry(
    "chunk sets", after_fork_in_child=lambda chunk_set: chunk_set._drop_handles()
)


class ChunkSet:
    """The chunk files of one version, read by global record index.

    ``source``: where chunks missing from ``directory`` come from (reading on demand); then
    every read is bracketed by ``read_begins`` / ``read_ends`` (DataRefOnDemand does it).
    """

    def __init__(
        self, directory: str, manifest: Manifest, source: ChunkSource | None = None
    ) -> None:
        self.directory = directory
        self.name = f"{manifest.dataset_id}:{manifest.version}"
        self.chunks: list[ChunkInfo] = list(manifest.chunks)
        self.starts = np.cumsum([0] + [c.records for c in self.chunks], dtype=np.int64)
        self.num_records = int(self.starts[-1])
        # Each open chunk holds a descriptor, and one more while it is read ahead.
        lifecycle.allow_open_files(2 * len(self.chunks))
        self._schema = schema_digest(manifest.schema) if manifest.format_version >= 2 else ""
        self._envs: list[lmdb.Environment | None] = [None] * len(self.chunks)
        # The state each open chunk's file was checked in, and the open chunks' numbers.
        self._states: list[FileState | None] = [None] * len(self.chunks)
        self._open_numbers: list[int] = []
        self._next_check = 0.0
        self._local = threading.local()
        self._lock = threading.Lock()
        # Threads that have read through this set (their transactions map its files).
        self._readers: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        # Shared environments this set holds; released on close() or when it is collected.
        self._held: list[tuple[int, int]] = []
        self._finalizer = weakref.finalize(self, _ENVIRONMENTS.release_later, self._held)
        self._ahead: ReadAhead | None = None
        self._source = source
        self._demand = (
            WorkingSet(
                [c.bytes for c in self.chunks], source.keep_open_bytes, source.max_open_bytes
            )
            if source is not None
            else None
        )
        _OPEN_SETS.add(self)

    def _drop_handles(self) -> None:
        self._envs = [None] * len(self.chunks)
        self._states = [None] * len(self.chunks)
        self._open_numbers = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._readers = weakref.WeakSet()
        self._held.clear()
        if self._demand is not None:
            self._demand.forget_after_fork()

    def close(self) -> None:
        """Let go of this set's LMDB handles; the next read opens them again. While other
        threads read through this set, only this thread's transactions go: unmapping the files
        under their reads would crash the process."""
        if self._ahead is not None:
            self._ahead.close()
        with self._lock:
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
            _ENVIRONMENTS.release(self._held)
            self._envs = [None] * len(self.chunks)
            self._states = [None] * len(self.chunks)
            self._open_numbers = []
            self._local = threading.local()
            self._let_go_of_everything()

    def _env(self, number: int) -> lmdb.Environment:
        env = self._envs[number]
        if env is None:
            if self._source is not None:
                return self._env_on_demand(number)
            with self._lock:
                env = self._envs[number]
                if env is None:
                    env = self._envs[number] = self._open(number)
        return env

    def _where(self, number: int) -> str:
        return f"{self.chunks[number].file} of {self.name} (in {self.directory})"

    def _open(self, number: int) -> lmdb.Environment:
        """Check chunk ``number`` (size, contents, identity) and open it."""
        info = self.chunks[number]
        path = os.path.join(self.directory, info.file)
        where = self._where(number)
        try:
            state = file_state(path)
        except FileNotFoundError:
            raise CacheCorrupted(f"chunk {where} is missing; {DAMAGED}") from None
        except OSError as exc:
            raise unreadable(path, exc) from None
        if state.size != info.bytes:
            raise CacheCorrupted(
                f"chunk {where} has {state.size} bytes, the manifest says {info.bytes}; {DAMAGED}"
            )
        if not trusted(path, state, info.sha256):
            state = verify_and_stamp(path, info, where)
        try:
            key, env = _ENVIRONMENTS.acquire(path)
        except lmdb.Error as exc:
            reason = _os_error(exc)
            if reason is not None:  # not the file's fault: permissions, memory, descriptors
                raise unreadable(path, reason) from None
            raise CacheCorrupted(
                f"chunk {where} is not a readable LMDB file: {exc}; {DAMAGED}"
            ) from None
        except OSError as exc:
            raise unreadable(path, exc) from None
        self._held.append(key)
        try:
            self._check_structure(number, env)
            now = file_state(path)
            if key != (state.device, state.inode) or not same_bytes(now, state):
                raise CacheCorrupted(f"chunk {where} changed while it was being opened; {DAMAGED}")
            state = now
        except BaseException:
            self._held.remove(key)
            _ENVIRONMENTS.release([key])
            raise
        self._states[number] = state
        self._open_numbers.append(number)
        return env

    def _check_structure(self, number: int, env: lmdb.Environment) -> None:
        """The chunk holds what its manifest entry says: entry counts, and (format 2) its id,
        counts and schema digest, so a chunk file of another build or version is refused."""
        info = self.chunks[number]
        where = self._where(number)
        identity = 1 if info.id else 0
        try:
            entries = env.stat()["entries"]
            with env.begin(buffers=False) as txn:
                stored = txn.get(IDENTITY_KEY) if identity else None
        except lmdb.Error as exc:
            raise CacheCorrupted(f"chunk {where}: LMDB cannot read it ({exc}); {DAMAGED}") from None
        if entries != info.records + len(info.columns) + identity:
            raise CacheCorrupted(
                f"chunk {where} holds {entries} entries, the manifest says {info.records} "
                f"records and {len(info.columns)} columns; {DAMAGED}"
            )
        if not identity:
            return
        want = chunk_identity(info, self._schema)
        try:
            found = json.loads(bytes(stored)) if stored is not None else None
        except ValueError:
            found = None
        if found != want:
            raise CacheCorrupted(
                f"chunk {where} is not the chunk the manifest names: it says it is {found}, the "
                f"manifest expects {want} (a chunk file of another build or version, or a "
                f"manifest edited by hand); {DAMAGED}"
            )

    def open_first(self) -> None:
        """Open (and so check) the first chunk on disk now: a manifest whose schema or chunk
        list does not match the chunks fails here, before anyone reads a field by its name.
        (Chunks a sharded pull left out are skipped.)"""
        for number, info in enumerate(self.chunks):
            if os.path.exists(os.path.join(self.directory, info.file)):
                self._env(number)
                return

    def check_files(self) -> None:
        """Raise CacheCorrupted if an open chunk's file changed since it was checked, unless
        it still hashes to the manifest's sha256 (then it is trusted in its new state)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        for number in list(self._open_numbers):
            state = self._states[number]
            if state is None:
                continue
            path = os.path.join(self.directory, self.chunks[number].file)
            try:
                current: FileState | None = file_state(path)
            except OSError:
                current = None
            if current != state:
                self._changed(number, path, state, current)
        spent = time.monotonic() - now
        self._next_check = now + max(RECHECK_SECONDS, _RECHECK_SHARE * spent)

    def _changed(self, number: int, path: str, state: FileState, current: FileState | None) -> None:
        where = self._where(number)
        if current is not None and current[:3] == state[:3]:
            # The same file, written to or touched: served only if its bytes are still right.
            try:
                self._states[number] = verify_and_stamp(path, self.chunks[number], where)
                return
            except CacheCorrupted:
                self._forget(number)
                raise
        self._forget(number)
        if current is None:
            what = "was removed"
        elif current[:2] == state[:2]:
            what = f"was cut to {current.size} bytes (the manifest says {state.size})"
        else:
            what = "was replaced by another file"
        raise CacheCorrupted(
            f"chunk {where} {what} while it was open: nothing more is read from it; open the "
            f"version again to read what is there now (it is checked then). {DAMAGED}"
        )

    def _forget(self, number: int) -> None:
        """Stop using chunk ``number``: the next read opens (and checks) it again."""
        with self._lock:
            self._envs[number] = None
            self._states[number] = None
            if number in self._open_numbers:
                self._open_numbers.remove(number)
        self._local = threading.local()  # every thread's transactions and column views

    def _failed(self, number: int | None, exc: lmdb.Error, what: str) -> YogaError:
        """A CacheCorrupted for an LMDB error while reading chunk ``number`` (None: one of a
        batch's); this thread's transactions on it are renewed, so reads of good records go on.
        (A read of handles another thread closed is said to be that, not damage.)"""
        txns = getattr(self._local, "txns", None) or []
        for n, txn in enumerate(txns):
            if txn is not None and number in (None, n):
                with contextlib.suppress(lmdb.Error):
                    txn.abort()
                txns[n] = None
        views = getattr(self._local, "columns", None)
        if views:
            for key in [k for k in views if number in (None, k[0])]:
                del views[key]
        where = f"chunk {self._where(number)}" if number is not None else f"a chunk of {self.name}"
        if _CLOSED in str(exc):
            return YogaError(
                f"{where}: {what} could not be read: another thread closed this DataRef "
                "(ref.close()) while this thread read it. close() lets go of the handles every "
                "thread of the process reads through: call it only once no thread reads"
            )
        return CacheCorrupted(
            f"{where}: LMDB could not read {what} ({type(exc).__name__}: {exc}); {DAMAGED}"
        )

    def txn(self, number: int) -> lmdb.Transaction:
        """This thread's long-lived read transaction on chunk ``number``."""
        txns = getattr(self._local, "txns", None)
        if txns is None:
            txns = self._local.txns = [None] * len(self.chunks)
            self._readers.add(threading.current_thread())
        txn = txns[number]
        if txn is None:
            txn = txns[number] = self._env(number).begin(buffers=True)
        return txn

    def columns(self) -> frozenset[str]:
        """Fields that every chunk also holds as a whole column array."""
        if not self.chunks:
            return frozenset()
        # Chunks of one build hold the same columns: intersect each distinct list once.
        return frozenset.intersection(*map(frozenset, {c.columns for c in self.chunks}))

    def column(self, number: int, name: str, dtype: np.dtype) -> np.ndarray:
        """Chunk ``number``'s column of ``name``: a read-only view into the map, valid while
        this thread's transaction lives (so take what you need from it right away)."""
        views = getattr(self._local, "columns", None)
        if views is None:
            views = self._local.columns = {}
        array = views.get((number, name))
        if array is None:
            try:
                data = self.txn(number).get(column_key(name))
            except lmdb.Error as exc:
                raise self._failed(number, exc, f"column {name!r}") from None
            info = self.chunks[number]
            if data is None or len(data) != info.records * dtype.itemsize:
                raise CacheCorrupted(
                    f"chunk {self._where(number)}: column {name!r} is missing or short"
                )
            array = views[(number, name)] = np.frombuffer(data, dtype)
        return array

    def gather(self, name: str, dtype: np.dtype, indices: np.ndarray) -> np.ndarray:
        """Column ``name`` at global record ``indices``, without reading the records."""
        self.check_files()
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
            raise CacheCorrupted(f"record {index} is missing from chunk {self._where(number)}")
        return cast(memoryview, value)

    def get_many(self, indices: np.ndarray) -> list[memoryview]:
        """The values of many records, in the order given."""
        self.check_files()
        values: list[Value | None]
        n = len(indices)
        try:
            if n > 2 and indices[-1] - indices[0] == n - 1 and (np.diff(indices) == 1).all():
                values = self._get_run(int(indices[0]), n)
            elif len(self.chunks) == 1:
                values = list(map(self.txn(0).get, record_keys(indices)))
            else:
                chunk, local = self.locate(np.asarray(indices, dtype=np.int64))
                # Only the chunks this batch touches are opened.
                gets = {int(c): self.txn(int(c)).get for c in np.unique(chunk)}
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
                            f"chunk {self._where(number)}: records {start}..{start + take - 1} "
                            f"are not where its keys say; {DAMAGED}"
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
        for number, info in enumerate(self.chunks):
            # On demand, each chunk is fetched (and so checked) if it is not here, and pinned
            # while it is hashed.
            held = self._source.acquire(number) if self._source is not None else None
            try:
                state = verify_and_stamp(os.path.join(self.directory, info.file), info)
            finally:
                if held is not None:
                    held.release()
            if self._states[number] is not None and self._states[number] != state:
                self._forget(number)  # a good file, but not the one open: open it again
            if on_chunk is not None:
                on_chunk(info)

    def __len__(self) -> int:
        return self.num_records

    # --- reading on demand (cache/demand.py) ---

    def _env_on_demand(self, number: int) -> lmdb.Environment:
        """``_env`` of a set reading on demand: the chunk is fetched and pinned first (outside
        the lock, so that other threads open other chunks meanwhile), then opened and checked
        as every chunk is; chunks beyond the working set are retired."""
        assert self._source is not None and self._demand is not None
        held = self._source.acquire(number)
        with self._lock:
            env = self._envs[number]
            if env is not None:  # another thread opened it meanwhile
                held.release()
                return env
            try:
                env = self._open(number)
            except BaseException:
                held.release()
                raise
            self._envs[number] = env
            state = self._states[number]
            assert state is not None
            for old in self._demand.opened(number, (state.device, state.inode), held):
                # No read reaches this opening any more; it goes once no thread can hold
                # views into it.
                self._envs[old] = None
                self._states[old] = None
                if old in self._open_numbers:
                    self._open_numbers.remove(old)
                self._demand.retire(old)
            self._unmap(self._demand.free())
        return env

    def _unmap(self, retired: list[Retired]) -> None:
        """Close retired chunks' environments (their maps go with the last user in the
        process) and drop their pins. Under ``self._lock``."""
        for chunk in retired:
            if chunk.key in self._held:  # (close() may have let go of every handle already)
                self._held.remove(chunk.key)
                _ENVIRONMENTS.release([chunk.key])
            chunk.held.release()

    def _let_go_of_everything(self) -> None:
        """close(): the pins of every chunk held on demand, and what was fetched ahead."""
        if self._demand is not None:
            for _, held in self._demand.everything():
                held.release()
        if self._source is not None:
            self._source.close()

    def read_begins(self) -> None:
        """The calling thread starts a read through a set reading on demand. Its views of
        earlier reads are dead now (they are valid until the thread's next read), so its
        transactions on retired chunks go, and chunks nobody can reach any more are
        unmapped and unpinned."""
        if self._demand is None:
            return
        txns = getattr(self._local, "txns", None)
        if txns is None:
            txns = self._local.txns = [None] * len(self.chunks)
            self._readers.add(threading.current_thread())
        drop, free = self._demand.begin(txns)
        views = getattr(self._local, "columns", None)
        for number in drop:
            txn, txns[number] = txns[number], None
            if txn is not None:
                with contextlib.suppress(lmdb.Error):
                    txn.abort()
            if views:
                for key in [k for k in views if k[0] == number]:
                    del views[key]
        if free:
            with self._lock:
                self._unmap(free)

    def read_ends(self) -> None:
        """The calling thread's read returned (see ``read_begins``)."""
        if self._demand is not None:
            self._demand.end()

    def read_ahead(self, indices: np.ndarray) -> None:
        """Records at ``indices`` will be read soon: a hint, returns at once, changes nothing
        that is read. Reading on demand, the chunks they live in that are not open are fetched
        in the background, in the order first needed; from a local disk, their pages are asked
        of the disk (cache/readahead.py)."""
        if not len(indices):
            return
        if self._source is not None:
            chunk = np.searchsorted(self.starts, np.asarray(indices, np.int64), side="right") - 1
            numbers, first = np.unique(chunk, return_index=True)
            ordered = numbers[np.argsort(first, kind="stable")].tolist()
            self._source.read_ahead(
                [n for n in ordered if 0 <= n < len(self.chunks) and self._envs[n] is None]
            )
            # No page hints here: a chunk just fetched is in memory, and a file descriptor
            # held on a chunk the cache evicts would keep its disk space taken.
            return
        ahead = self._ahead
        if ahead is None:
            with self._lock:
                ahead = self._ahead
                if ahead is None:
                    ahead = self._ahead = ReadAhead(self.directory, self.chunks, self.starts)
        ahead.hint(indices)
