"""Results handed from a worker process to its parent through shared memory, without a copy.

A ``SharedRing`` is one worker process's stretch of shared memory. The parent makes it before it
starts the worker (which inherits it, or gets its file descriptor when spawned). The worker
pickles each result with protocol 5, copies the large buffers (numpy arrays' data) into a free
part of the ring and sends only the small rest (``Packed``) through its pipe; the parent rebuilds
the result with those arrays *in* the ring, and frees that part once the last array using it is
gone. A 24 MB batch then costs one copy in the worker instead of a pickle, two pipe copies and an
unpickle.

- Nothing to leak: the memory is an anonymous memfd, with no name in /dev/shm; the kernel frees
  it once the last process that maps it ends, however it ends (SIGKILL included).
- Bounded: a ring holds ``RING_BYTES`` and ``SLOTS`` results. A result that does not fit (the
  ring is full of results the caller still holds) goes through the pipe as before. Parts are
  taken lowest first, and only pages written are backed by memory, so a ring costs about the
  largest burst of results in flight, not ``RING_BYTES``.
- Never wrong data: a part is written again only after the parent freed it, which it does only
  when nothing references it. A process forked from the parent still maps the ring: what the
  parent holds when it forks is never freed (the ring keeps it until it is dropped). Only one
  process at a time writes a ring (an fcntl lock): a forked copy of a worker sends its results
  through the pipe.

Where there is no memfd (not Linux), ``SharedRing.create`` gives None and results go through
the pipe.
"""

from __future__ import annotations

import fcntl
import functools
import mmap
import os
import pickle
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MIN_SHARED", "RING_BYTES", "SLOTS", "Packed", "SharedRing"]

# Address space reserved per worker; memory is used only where results are written.
RING_BYTES = 256 << 20
# Results a ring holds at once (in flight, or still held by the caller).
SLOTS = 128
# Buffers smaller than this stay inside the pickle; results with fewer bytes of larger
# buffers than MIN_SHARED go through the pipe whole: below about 128 KiB, pickling them costs
# less than the ring's bookkeeping (a 64 KiB batch: 46 us in band, 98 us in the ring).
_MIN_BUFFER = 4 << 10
MIN_SHARED = 128 << 10
# The first page: a state byte per slot, then per slot the (offset, size) of its part.
_HEADER = 4096
_PLACES = 1024
_ALIGN = 64
_FREE, _BUSY = 0, 1

# Rings this process reads from: at a fork, what they hold stays theirs for good.
_READERS: weakref.WeakSet[SharedRing] = weakref.WeakSet()


@dataclass(frozen=True)
class Packed:
    """A pickled result: the pickle (``data``) and, when it is in a ring, where its buffers
    lie there (``spans`` of (offset, bytes) inside ``size`` bytes at ``offset``, in slot
    ``slot``); slot -1: all of it is in ``data``."""

    slot: int
    offset: int
    size: int
    spans: tuple[tuple[int, int], ...]
    data: bytes

    @classmethod
    def in_band(cls, data: bytes) -> Packed:
        return cls(-1, 0, 0, (), data)

    @property
    def shared(self) -> bool:
        """Whether some of it lies in the ring."""
        return self.slot >= 0


class SharedRing:
    """One worker's ring of shared memory: ``pack`` in the worker, ``unpack`` in the parent."""

    def __init__(self, fd: int, capacity: int, reader: int) -> None:
        self.fd = fd
        self.capacity = capacity
        self.reader = reader  # the process that unpacks (the one that made the ring)
        self._map = mmap.mmap(fd, capacity)
        self._states = np.frombuffer(self._map, np.uint8, SLOTS, 0)
        self._places = np.frombuffer(self._map, np.int64, 2 * SLOTS, _PLACES).reshape(SLOTS, 2)
        self._closer = weakref.finalize(self, os.close, fd)
        self._closer.atexit = False
        self._writer = 0  # the process holding the write lock; minus it when refused
        self._busy: dict[int, tuple[int, int]] = {}  # writer's: slot -> (offset, size)
        self._live: dict[int, weakref.ref[np.ndarray]] = {}  # reader's: slot -> its holder
        self._pinned: set[int] = set()
        self._lock = threading.Lock()

    @classmethod
    def create(cls, capacity: int | None = None) -> SharedRing | None:
        """A new ring read by this process (``RING_BYTES`` unless ``capacity`` says), or None
        where shared memory cannot be had."""
        capacity = RING_BYTES if capacity is None else capacity
        memfd_create = getattr(os, "memfd_create", None)
        if memfd_create is None:
            return None
        try:
            fd = memfd_create("yogadl_plus-ring", getattr(os, "MFD_CLOEXEC", 0))
        except OSError:
            return None
        try:
            os.ftruncate(fd, capacity)
            return cls(fd, capacity, os.getpid())
        except (OSError, ValueError):
            os.close(fd)
            return None

    def __reduce__(self) -> tuple[Any, ...]:
        # To a spawned worker: its file descriptor goes along, as multiprocessing sends a
        # Connection's (a forked worker simply inherits the ring).
        from multiprocessing.reduction import DupFd

        return (_attached, (DupFd(self.fd), self.capacity, self.reader))

    def __repr__(self) -> str:
        return f"SharedRing(fd={self.fd}, capacity={self.capacity}, reader={self.reader})"

    # --- in the worker ---

    def pack(self, obj: Any) -> Packed:
        """``obj`` pickled, its large buffers copied into the ring; all in the pickle when
        they are too small to be worth it, when there is no room, or when another process
        writes this ring. Unpicklable: pickle's own error."""
        buffers: list[memoryview] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            raw = buffer.raw()
            if raw.nbytes < _MIN_BUFFER:
                return True  # pickled in band
            buffers.append(raw)
            return False

        claimed = self._claimed()
        data = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band if claimed else None)
        if not buffers:
            return Packed.in_band(data)
        size = sum(_aligned(raw.nbytes) for raw in buffers)
        place = None
        if size >= MIN_SHARED:
            with self._lock:
                place = self._allocate(size)
        if place is None:
            return Packed.in_band(pickle.dumps(obj, protocol=5))
        slot, offset = place
        spans = []
        at = offset
        for raw in buffers:
            self._map[at : at + raw.nbytes] = raw
            spans.append((at - offset, raw.nbytes))
            at += _aligned(raw.nbytes)
        return Packed(slot, offset, size, tuple(spans), data)

    def _claimed(self) -> bool:
        pid = os.getpid()
        if self._writer in (pid, -pid):
            return self._writer == pid
        try:
            # A record lock: not inherited by a fork, released when the process ends.
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError:
            self._writer = -pid
            return False
        self._writer = pid
        # A writer that follows another (after a fork, a restart) starts from what the ring
        # says the reader still holds.
        busy = np.flatnonzero(self._states != _FREE).tolist()
        self._busy = {s: (int(self._places[s, 0]), int(self._places[s, 1])) for s in busy}
        return True

    def _allocate(self, size: int) -> tuple[int, int] | None:
        """(slot, offset) of ``size`` free bytes, lowest first (so that pages already
        written are written again), or None."""
        states = self._map[:SLOTS]
        busy = self._busy = {s: p for s, p in self._busy.items() if states[s] != _FREE}
        if len(busy) == SLOTS:
            return None
        offset = _HEADER
        for start, length in sorted(busy.values()):
            if start - offset >= size:
                break
            offset = max(offset, start + length)
        if offset + size > self.capacity:
            return None
        slot = next(s for s in range(SLOTS) if s not in busy)
        busy[slot] = (offset, size)
        self._places[slot] = (offset, size)
        self._states[slot] = _BUSY
        return slot, offset

    # --- in the parent ---

    def unpack(self, packed: Packed) -> Any:
        """The result, its large arrays in the ring; their part is freed when they are all
        gone."""
        if not packed.shared:
            return pickle.loads(packed.data)
        holder = np.frombuffer(self._map, np.uint8, packed.size, packed.offset)
        # Every buffer is a slice of one view of ``holder``, so each keeps ``holder`` alive:
        # it dies with the last array made from them.
        view = holder.data
        try:
            obj = pickle.loads(packed.data, buffers=[view[a : a + n] for a, n in packed.spans])
        except BaseException:
            del view, holder
            self.discard(packed)
            raise
        _READERS.add(self)
        self._live[packed.slot] = weakref.ref(holder, functools.partial(self._free, packed.slot))
        return obj

    def held(self) -> list[int]:
        """The slots whose results this process still holds (some of their arrays live)."""
        return sorted(self._live)

    def discard(self, packed: Packed) -> None:
        """Free a result's part without reading it (a result nobody asked for any more)."""
        if packed.shared:
            self._free(packed.slot)

    def _free(self, slot: int, _ref: Any = None) -> None:
        if os.getpid() != self.reader:
            return  # a forked child's copy of the parent's arrays: not its to free
        self._live.pop(slot, None)
        if slot not in self._pinned:
            self._states[slot] = _FREE

    def _pin_held(self) -> None:
        self._pinned.update(self._live)


def _attached(fd: Any, capacity: int, reader: int) -> SharedRing:
    return SharedRing(fd.detach(), capacity, reader)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _pin_before_fork() -> None:
    # A forked child maps the rings too, and may still read what the parent holds now after
    # the parent let go of it: those parts must never be written again.
    for ring in list(_READERS):
        ring._pin_held()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_pin_before_fork)
