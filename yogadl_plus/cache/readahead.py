"""Reads ahead of a stream on a cold disk: the pages of the records it reads next are asked of
the disk, many at once, while it reads the ones before.

The order is a pure function, so the stream knows exactly which records come next and hands
their indices to ``ReadAhead.hint``. A background thread finds where their bytes lie
(cache/pages.py) and asks the kernel for those ranges with ``posix_fadvise(WILLNEED)``, which
starts the reads and returns: the disk sees a deep queue of reads of the records' own size (one
100 KiB read instead of 25 page faults of 4 KiB taken one after another), and only the bytes the
stream will read. Pages already in memory cost a few probes per hint (``RWF_NOWAIT`` reads of
one byte), nothing more. Hints change only what is in the page cache, never what is read: a
stale or wrong hint costs speed, not data.

The kernel reads at most its read-ahead size of one ``WILLNEED`` call (``force_page_cache_ra``
in mm/readahead.c caps it at the larger of the device's ``read_ahead_kb`` and
``max_sectors_kb``, 128 KiB on many machines) and drops the rest without a word, so a range is
asked for in pieces of that size (``hint_piece_bytes``).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import os
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from yogadl_plus import lifecycle
from yogadl_plus.cache.manifest import ChunkInfo
from yogadl_plus.cache.pages import PageMap, page_map

__all__ = ["MIN_RECORD_BYTES", "PENDING_RECORDS", "ReadAhead", "hint_piece_bytes"]

#: Chunks whose records are smaller than this on average get no page hints. All are hinted: a
#: small record's hint is its leaf page (found from the branch pages alone, 20 ms per 288 MiB
#: chunk, once), and cold, hinting them read a true shuffle of 264 B records 2.2x faster, while
#: warm they pay 2-4% (docs/performance.md). Benchmarks set it to compare.
MIN_RECORD_BYTES = 0
#: Records of hints waiting for the thread at most, far more than a stream announces ahead (a
#: few thousand); past it, the oldest hints are dropped (the stream has read past them). A
#: stream hands over its whole window before it reads a record, in as many hints as it has
#: units there (a hundred of batches of one): those first hints are the ones read first.
PENDING_RECORDS = 1 << 16
# Spans probed for residency per chunk and hint: all in memory means nothing to ask for.
_PROBES = 4
# After this many hints in a row found everything in memory, only a hint every _WARM_SAMPLE
# records is looked at (a warm version costs the stream almost nothing); a miss looks at all
# again. Counted in records, not hints: a serve costs about the same whatever its size, and the
# sources of a mixture each get a share of every unit's records, a hint each. And at least a
# hint every _WARM_SAMPLE_BYTES of records: pages go cold again (a version bigger than memory, a
# page cache dropped between epochs), and 8192 big records unhinted are gigabytes read 4 KiB at
# a time before a miss is seen. While warm, a sample looks at its first record only
# (_first_resident: a whole serve every 4 MiB cost warm 256 KiB records 14%).
_WARM_STREAK = 8
_WARM_SAMPLE = 8192
_WARM_SAMPLE_BYTES = 4 << 20
# Spans closer than this are asked for as one range (sequential reads become big ones).
_MERGE_GAP = 64 << 10
_CAN_PROBE = hasattr(os, "preadv") and hasattr(os, "RWF_NOWAIT")
# The pieces a range is asked for in where the device's read-ahead size is not found (the
# kernel's default read_ahead_kb).
_DEFAULT_PIECE = 128 << 10
# Each device's piece size, found once per process (a few reads of /sys).
_PIECES: dict[int, int] = {}
# Every live ReadAhead. At exit, while the interpreter is whole, each stops its thread: a daemon
# thread still inside an extension when Python finalizes is ended from in there (pthread_exit),
# and where that unwinds through C++ code the process aborts, "terminate called without an
# active exception" (CI saw it once, as a process that had streamed exited).
_ALL: lifecycle.Registry[ReadAhead] = lifecycle.Registry(
    "read-ahead threads", at_exit=lambda ahead: ahead.close()
)


class ReadAhead:
    """``hint(indices)``: start reading these records of a version's chunks from disk."""

    def __init__(self, directory: str, chunks: Sequence[ChunkInfo], starts: np.ndarray) -> None:
        self._directory = directory
        self._chunks = chunks
        self._starts = starts
        self._lock = threading.Condition()
        self._pending: collections.deque[np.ndarray] = collections.deque()
        self._pending_records = 0
        self._thread: threading.Thread | None = None
        self._files: dict[int, tuple[int, PageMap] | None] = {}
        self._closed = False
        # Held while the thread serves a hint: a fork waits for it (see _pause_for_fork).
        self._busy = threading.Lock()
        self._resident_streak = 0  # hints in a row whose pages were all in memory
        self._skipped = 0  # records hinted since the last hint looked at, while warm
        records = sum(info.records for info in chunks)
        # Records hinted that are as many stored bytes as _WARM_SAMPLE_BYTES, on average.
        self._sample = _WARM_SAMPLE
        if records:
            average = sum(info.bytes for info in chunks) / records
            self._sample = max(1, min(_WARM_SAMPLE, int(_WARM_SAMPLE_BYTES // max(average, 1))))
        _ALL.add(self)

    def hint(self, indices: np.ndarray) -> None:
        """Ask for these global record indices' pages, in the background (never blocks)."""
        if not len(indices) or self._closed:
            return
        if self._resident_streak >= _WARM_STREAK:
            self._skipped += len(indices)
            if self._skipped < self._sample:
                return
            self._skipped = 0
        with self._lock:
            self._pending.append(indices)
            self._pending_records += len(indices)
            while self._pending_records > PENDING_RECORDS and len(self._pending) > 1:
                self._pending_records -= len(self._pending.popleft())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=_run_thread,
                    args=(weakref.ref(self),),
                    name="yogadl-readahead",
                    daemon=True,
                )
                self._thread.start()
            self._lock.notify()

    def close(self) -> None:
        """Stop the thread and close the files (a later hint starts again)."""
        with self._lock:
            self._pending.clear()
            self._pending_records = 0
            thread, self._thread = self._thread, None
            self._closed = True
            self._lock.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        for entry in self._files.values():
            if entry is not None:
                with contextlib.suppress(OSError):
                    os.close(entry[0])
        self._files = {}
        self._closed = False
        # What is in memory may change before the next hint (a page cache dropped between
        # epochs): look again from the first.
        self._resident_streak = self._skipped = 0

    def _forget_after_fork(self) -> None:
        # The thread did not come along; the file descriptors did and stay usable.
        self._lock = threading.Condition()
        self._busy = threading.Lock()
        self._pending.clear()
        self._pending_records = 0
        self._thread = None

    def _next(self) -> np.ndarray | bool:
        """The next hint to serve; True when there was none for a second (the thread lets go
        of this ReadAhead meanwhile, so that it can be collected); False: the thread ends."""
        with self._lock:
            if not self._pending and self._thread is threading.current_thread():
                self._lock.wait(timeout=1.0)
            if self._thread is not threading.current_thread():
                return False
            if not self._pending:
                return True
            indices = self._pending.popleft()
            self._pending_records -= len(indices)
            return indices

    def _serve(self, indices: np.ndarray) -> None:
        if self._resident_streak >= _WARM_STREAK and self._first_resident(indices):
            return  # warm: a sample's first record in memory says the version still is
        chunk = np.searchsorted(self._starts, indices, side="right") - 1
        resident = True
        for number in np.unique(chunk).tolist():
            entry = self._file(number)
            if entry is None:
                continue
            fd, pages = entry
            local = indices[chunk == number] - self._starts[number]
            offsets, lengths = pages.spans(local)
            if _resident(fd, offsets[:_PROBES]):
                continue
            resident = False
            piece = hint_piece_bytes(fd)
            for start, length in _merged(offsets, lengths):
                for at in range(start, start + length, piece):
                    with contextlib.suppress(OSError):
                        os.posix_fadvise(
                            fd, at, min(piece, start + length - at), os.POSIX_FADV_WILLNEED
                        )
        self._resident_streak = self._resident_streak + 1 if resident else 0

    def _first_resident(self, indices: np.ndarray) -> bool:
        """True when the first of these records is in memory: a few microseconds, where
        serving the hint costs about 100 (looked at every few MiB of big records, warm)."""
        first = int(indices[0])
        number = bisect.bisect_right(self._starts, first) - 1
        entry = self._file(number) if number >= 0 else None
        if entry is None:
            return False
        offsets, _ = entry[1].spans(np.array([first - int(self._starts[number])]))
        return _resident(entry[0], offsets)

    def _file(self, number: int) -> tuple[int, PageMap] | None:
        if number in self._files:
            return self._files[number]
        info = self._chunks[number]
        entry: tuple[int, PageMap] | None = None
        if not info.records or info.bytes / info.records < MIN_RECORD_BYTES:
            self._files[number] = None
            return None
        try:
            fd = os.open(os.path.join(self._directory, info.file), os.O_RDONLY)
        except OSError:
            fd = -1  # not on disk (a chunk a sharded pull left out): nothing to read ahead
        if fd >= 0:
            pages = page_map(fd, info.records)
            if pages is None:
                os.close(fd)
            else:
                entry = (fd, pages)
        self._files[number] = entry
        return entry


def _run_thread(owner: weakref.ref[ReadAhead]) -> None:
    """The read-ahead thread: serve hints until the ReadAhead closes or is collected."""
    while True:
        ahead = owner()
        if ahead is None:
            return
        indices = ahead._next()
        if indices is False:
            return
        if indices is not True:
            with ahead._busy, contextlib.suppress(Exception):  # a hint never fails a read
                ahead._serve(indices)
        del ahead


def hint_piece_bytes(fd: int) -> int:
    """The most bytes one ``posix_fadvise(WILLNEED)`` on ``fd`` reads: the larger of its
    device's ``read_ahead_kb`` and ``max_sectors_kb`` (128 KiB where /sys does not say)."""
    device = os.fstat(fd).st_dev
    piece = _PIECES.get(device)
    if piece is None:
        piece = _PIECES[device] = _device_piece(os.major(device), os.minor(device))
    return piece


def _device_piece(major: int, minor: int) -> int:
    """The read-ahead cap of block device ``major:minor``, from /sys: its queue's (a
    partition's is its disk's), else its backing device's (network and FUSE file systems)."""
    block = f"/sys/dev/block/{major}:{minor}"
    if os.path.exists(os.path.join(block, "partition")):
        block = os.path.join(block, "..")
    for folder, names in (
        (os.path.join(block, "queue"), ("read_ahead_kb", "max_sectors_kb")),
        (f"/sys/class/bdi/{major}:{minor}", ("read_ahead_kb",)),
    ):
        sizes = [_read_kib(os.path.join(folder, name)) for name in names]
        found = [size for size in sizes if size is not None]
        if found:
            return max(max(found), 4096)
    return _DEFAULT_PIECE


def _read_kib(path: str) -> int | None:
    """The number of KiB a /sys file holds, in bytes; None where it is missing or odd."""
    try:
        with open(path) as f:
            return int(f.read().strip()) << 10
    except (OSError, ValueError):
        return None


def _resident(fd: int, offsets: np.ndarray) -> bool:
    """True when the first byte of each span is in the page cache."""
    if not _CAN_PROBE:
        return False
    probe = bytearray(1)
    for offset in offsets.tolist():
        try:
            if os.preadv(fd, [probe], offset, os.RWF_NOWAIT) != 1:
                return False
        except OSError:  # BlockingIOError: not in memory (or the flag is refused)
            return False
    return True


def _merged(offsets: np.ndarray, lengths: np.ndarray) -> list[tuple[int, int]]:
    """The spans sorted and joined where they touch or nearly do: (start, length) ranges."""
    order = np.argsort(offsets, kind="stable")
    starts, ends = offsets[order], offsets[order] + lengths[order]
    reach = np.maximum.accumulate(ends)  # how far the spans so far go
    # A range ends where the next span starts beyond the reach so far (plus the gap).
    breaks = np.flatnonzero(starts[1:] > reach[:-1] + _MERGE_GAP)
    first = np.concatenate(([0], breaks + 1))
    last = np.concatenate((breaks, [len(starts) - 1]))
    begins = starts[first]
    return list(zip(begins.tolist(), (reach[last] - begins).tolist()))


# The read-ahead objects a fork in progress paused (their _busy locks, held by the forking thread).
_PAUSED: list[ReadAhead] = []


def _pause_for_fork() -> None:
    """Before a fork: wait until no read-ahead thread is serving a hint. A thread forked in the
    middle of one may hold a lock the child then waits for forever (numpy imports numpy.ma
    lazily on a first np.unique: the child's workers hung on that import lock)."""
    for ahead in list(_ALL):
        ahead._busy.acquire()
        _PAUSED.append(ahead)


def _resume_after_fork() -> None:
    while _PAUSED:
        _PAUSED.pop()._busy.release()


def _forget_threads_after_fork() -> None:
    _PAUSED.clear()  # the child's copies of the locks are made anew
    for ahead in list(_ALL):
        ahead._forget_after_fork()


lifecycle.on_fork(
    before=_pause_for_fork,
    after_in_parent=_resume_after_fork,
    after_in_child=_forget_threads_after_fork,
)
