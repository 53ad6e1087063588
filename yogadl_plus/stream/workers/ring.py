"""Results handed from a worker process to its parent through shared memory, without a copy.

A ``SharedRing`` is one worker process's stretch of shared memory. The parent makes it before it
starts the worker (which inherits it, or gets its file descriptor when spawned). The worker
pickles each result with protocol 5, copies the large buffers (numpy arrays' data) into a free
part of the ring and sends only the small rest (``Packed``) through its pipe; the parent rebuilds
the result with those arrays *in* the ring, and frees that part once the last array using it is
gone. A 24 MB batch then costs one copy in the worker instead of a pickle, two pipe copies and an
unpickle. Arrays the worker made in the ring to begin with (``empty``: a decoder's output) are
handed over without even that copy.

- Nothing to leak: the memory is an anonymous memfd, with no name in /dev/shm; the kernel frees
  it once the last process that maps it ends, however it ends (SIGKILL included).
- Bounded: a ring holds ``RING_BYTES`` and ``SLOTS`` parts. A result that does not fit (the ring
  is full of results the caller still holds) is pickled whole, as without a ring. Parts are
  taken lowest first, and only pages written are backed by memory, so a ring costs about the
  largest burst of results in flight, not ``RING_BYTES``.
- Never wrong data: a part is written again only once the parent freed it, which it does only
  when nothing references it, and once the worker holds nothing in it either. A process forked
  from the parent still maps the ring: what the parent holds when it forks is never freed (the
  ring keeps it until it is dropped). Only one process at a time writes a ring (an fcntl lock):
  a forked copy of a worker pickles its results whole.

Where there is no memfd (not Linux), ``SharedRing.create`` gives None and results are pickled
whole.
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

from yogadl_plus import lifecycle

__all__ = ["MIN_SHARED", "RING_BYTES", "SLOTS", "Packed", "SharedRing"]

# Address space reserved per worker; memory is used only where results are written.
RING_BYTES = 256 << 20
# Parts a ring holds at once (results in flight, or still held by the caller).
SLOTS = 128
# Buffers smaller than this stay inside the pickle; results with fewer bytes of larger
# buffers than MIN_SHARED are pickled whole: below about 128 KiB, pickling them costs less
# than the ring's bookkeeping (a 64 KiB batch: 46 us in band, 98 us in the ring).
_MIN_BUFFER = 4 << 10
MIN_SHARED = 128 << 10
# The first page: a state byte per slot, then per slot the (offset, size) of its part, then
# per slot the tag of the work that took it (see ``reclaim``).
_HEADER = 4096
_PLACES = 1024
_TAGS = _PLACES + 2 * 8 * SLOTS
_ALIGN = 64
_FREE, _BUSY = 0, 1


@dataclass(frozen=True)
class Packed:
    """A pickled result: the pickle (``data``), the ring's parts that hold its large buffers
    (``parts``: slot, offset, size), and where each buffer lies in them (``spans``: part,
    offset in it, bytes). No parts: all of it is in ``data``."""

    data: bytes
    parts: tuple[tuple[int, int, int], ...] = ()
    spans: tuple[tuple[int, int, int], ...] = ()

    @property
    def shared(self) -> bool:
        """Whether some of it lies in the ring."""
        return bool(self.parts)


class SharedRing:
    """One worker's ring of shared memory: ``empty`` and ``pack`` in the worker, ``unpack`` in
    the parent."""

    def __init__(self, fd: int, capacity: int, reader: int) -> None:
        self.fd = fd
        self.capacity = capacity
        self.reader = reader  # the process that unpacks (the one that made the ring)
        self._map = mmap.mmap(fd, capacity)
        self._states = np.frombuffer(self._map, np.uint8, SLOTS, 0)
        self._places = np.frombuffer(self._map, np.int64, 2 * SLOTS, _PLACES).reshape(SLOTS, 2)
        self._tags = np.frombuffer(self._map, np.int64, SLOTS, _TAGS)
        #: The writer's tag for the parts it takes from now on (``reclaim``).
        self.tag = 0
        self._address = self._states.__array_interface__["data"][0]
        self._closer = weakref.finalize(self, os.close, fd)
        self._closer.atexit = False
        # Reentrant: a part's array may die (and free it) while the ring is being changed.
        self._lock = threading.RLock()
        # The writer's: the process holding the write lock (minus it when refused), the parts
        # it took that the reader may still hold, the parts of arrays it made with empty() that
        # it still holds, and which of those it handed over.
        self._writer = 0
        self._busy: dict[int, tuple[int, int]] = {}
        self._made: dict[int, weakref.ref[np.ndarray]] = {}
        self._handed: set[int] = set()
        # The reader's: slot -> the holder of a part it unpacked, and the parts it holds for
        # good (held at a fork).
        self._live: dict[int, weakref.ref[np.ndarray]] = {}
        self._pinned: set[int] = set()

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

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """``np.empty(shape, dtype)``, in the ring when it is big enough, there is room and
        this process writes the ring: ``pack`` then hands it over without copying it. (A
        decoder can make its output here: it has ``ArrayRecycler``'s ``empty`` and
        ``clear``.)"""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < MIN_SHARED or not self._claimed():
            return np.empty(shape, dtype)
        size = _aligned(nbytes)
        with self._lock:
            place = self._allocate(size)
            if place is None:
                return np.empty(shape, dtype)
            slot, offset = place
            holder = np.frombuffer(self._map, np.uint8, size, offset)
            self._made[slot] = weakref.ref(holder, functools.partial(self._dropped, slot))
        return holder[:nbytes].view(dtype).reshape(shape)

    def clear(self) -> None:
        """Nothing to forget (``ArrayRecycler.clear``'s place): parts free themselves."""

    def pack(self, obj: Any) -> Packed:
        """``obj`` pickled, its large buffers in the ring (copied there, unless ``empty`` made
        them there); all in the pickle when they are too small to be worth it, when there is
        no room, or when another process writes this ring. Unpicklable: pickle's own error."""
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
            return Packed(data)
        with self._lock:
            packed = self._place(data, buffers)
        return packed if packed is not None else Packed(pickle.dumps(obj, protocol=5))

    def _place(self, data: bytes, buffers: list[memoryview]) -> Packed | None:
        """The Packed of a pickle whose out-of-band ``buffers`` are put in the ring, or None."""
        parts: dict[int, int] = {}  # slot -> its index in the Packed's parts
        spans: list[tuple[int, int, int]] = []
        copied: list[tuple[int, memoryview]] = []  # (index in spans, buffer) to copy
        copy_bytes = 0
        for raw in buffers:
            found = self._made_part(raw)
            if found is None:
                copied.append((len(spans), raw))
                spans.append((-1, copy_bytes, raw.nbytes))
                copy_bytes += _aligned(raw.nbytes)
            else:
                slot, start = found
                spans.append((parts.setdefault(slot, len(parts)), start, raw.nbytes))
        if copy_bytes + sum(self._busy[s][1] for s in parts) < MIN_SHARED:
            return None
        places = [(slot, *self._busy[slot]) for slot in parts]
        if copied:
            place = self._allocate(copy_bytes)
            if place is None:
                return None
            slot, offset = place
            places.append((slot, offset, copy_bytes))
            for j, raw in copied:
                _, start, nbytes = spans[j]
                self._map[offset + start : offset + start + nbytes] = raw
                spans[j] = (len(places) - 1, start, nbytes)
        self._handed.update(parts)
        return Packed(data, tuple(places), tuple(spans))

    def _made_part(self, raw: memoryview) -> tuple[int, int] | None:
        """(slot, offset in its part) of a buffer that lies in a part ``empty`` made and this
        process has not handed over yet; None for any other buffer."""
        if not self._made:
            return None
        address = np.frombuffer(raw, np.uint8).__array_interface__["data"][0] - self._address
        for slot in list(self._made):
            offset, size = self._busy[slot]
            if offset <= address and address + raw.nbytes <= offset + size:
                return None if slot in self._handed else (slot, address - offset)
        return None

    def _dropped(self, slot: int, _ref: Any = None) -> None:
        # The worker's last array in a part that empty() made is gone: the part is free
        # unless it was handed over (the reader frees it then).
        with self._lock:
            self._made.pop(slot, None)
            if slot in self._handed:
                self._handed.discard(slot)
            elif os.getpid() == abs(self._writer):
                self._states[slot] = _FREE

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
        self._made, self._handed = {}, set()
        return True

    def _allocate(self, size: int) -> tuple[int, int] | None:
        """(slot, offset) of ``size`` free bytes, lowest first (so that pages already
        written are written again), or None. A part is free once the reader let go of it
        and this process holds nothing in it either."""
        states = self._map[:SLOTS]
        busy = self._busy = {
            s: p for s, p in self._busy.items() if states[s] != _FREE or s in self._made
        }
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
        self._tags[slot] = self.tag
        self._states[slot] = _BUSY
        return slot, offset

    # --- in the parent ---

    def unpack(self, packed: Packed) -> Any:
        """The result, its large arrays in the ring; each part is freed when the last array
        in it is gone."""
        if not packed.shared:
            return pickle.loads(packed.data)
        # Every buffer is a slice of one view of its part's holder, so each keeps the holder
        # alive: it dies with the last array made from that part.
        holders = [np.frombuffer(self._map, np.uint8, size, at) for _, at, size in packed.parts]
        views = [holder.data for holder in holders]
        try:
            obj = pickle.loads(
                packed.data,
                buffers=[views[part][at : at + n] for part, at, n in packed.spans],
            )
        except BaseException:
            del views, holders
            self.discard(packed)
            raise
        _READERS.add(self)
        for (slot, _, _), holder in zip(packed.parts, holders):
            self._live[slot] = weakref.ref(holder, functools.partial(self._free, slot))
        return obj

    def reclaim(self, tag: int) -> int:
        """Free the parts taken by work tagged before ``tag`` that this process does not hold:
        results a consumer dropped unread (a DataLoader's persistent workers, reset for a new
        epoch, throw away what was in flight). Only once the writer works under ``tag`` or later
        and every result of earlier tags was delivered or dropped. Returns how many."""
        if os.getpid() != self.reader:
            return 0
        stale = np.flatnonzero((self._states != _FREE) & (self._tags < tag)).tolist()
        freed = [s for s in stale if s not in self._live and s not in self._pinned]
        for slot in freed:
            self._states[slot] = _FREE
        return len(freed)

    def held(self) -> list[int]:
        """The slots whose parts this process still holds (some of their arrays live)."""
        return sorted(self._live)

    def discard(self, packed: Packed) -> None:
        """Free a result's parts without reading it (a result nobody asked for any more)."""
        for slot, _, _ in packed.parts:
            self._free(slot)

    def _free(self, slot: int, _ref: Any = None) -> None:
        if os.getpid() != self.reader:
            return  # a forked child's copy of the parent's arrays: not its to free
        self._live.pop(slot, None)
        if slot not in self._pinned:
            self._states[slot] = _FREE

    def pin_held(self) -> None:
        """What this process holds now is never written again (a fork is coming)."""
        self._pinned.update(self._live)


def _attached(fd: Any, capacity: int, reader: int) -> SharedRing:
    return SharedRing(fd.detach(), capacity, reader)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


# Rings this process reads from. A forked child maps them too, and may still read what the
# parent holds now after the parent let go of it: those parts must never be written again.
_READERS: lifecycle.Registry[SharedRing] = lifecycle.Registry(
    "shared rings read here", before_fork=SharedRing.pin_held
)
