"""Reading a bucket's version without pulling it first: chunks are fetched when a read needs
them, or ahead of the reads a Stream announces, into the bounded local cache.

``RemoteStorage.fetch`` reads on demand when the version does not fit ``local_cache_limit``
(or when asked, ``on_demand=True``): it writes the manifest into the local copy and hands out a
``DataRefOnDemand`` whose ChunkSet asks a ChunkFetcher for each chunk it opens
(cache/demand.py). A chunk is fetched once per machine at a time (the chunk's lock in the local
cache), in ranged parts in parallel where it is large, into a file made at its full size first
(so the room it takes is counted before a byte arrives), checked against the manifest's sha256
and renamed into place; it is pinned while a reader has it open or fetched ahead, and otherwise
evicted least recently used when room is needed (mirror.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from yogadl_plus import lifecycle
from yogadl_plus.cache.manifest import ChunkInfo
from yogadl_plus.errors import NoRoom, StorageError
from yogadl_plus.storage.chunkdownload import PART_BYTES, RangedDownload, VersionCopy
from yogadl_plus.storage.mirror import Mirror
from yogadl_plus.storage.objects import ObjectStore
from yogadl_plus.storage.pins import Pin

__all__ = ["ChunkFetcher", "DemandSettings"]

log = logging.getLogger(__name__)
#: A reader that waited this long for a chunk says so (a WARNING): the stream is data-bound.
SLOW_CHUNK_SECONDS = 10.0

# What a reader with no cache limit fetches ahead at most.
_UNLIMITED_AHEAD_BYTES = 1 << 30

# In a forked child, every fetcher forgets the parent's fetch threads and lets go of its pins.
_FETCHERS: lifecycle.Registry[ChunkFetcher] = lifecycle.Registry(
    "chunk fetchers", after_fork_in_child=lambda fetcher: fetcher.forget_after_fork()
)


@dataclasses.dataclass(frozen=True)
class DemandSettings:
    """How much of the local cache one reader on demand uses (per process).

    ``keep_open_bytes``: chunks kept open (mapped and pinned) beyond those its reads need at
    the moment, at first; ``max_open_bytes``: as many as that, for reads that keep opening
    the same few chunks again (cache/demand.py); ``read_ahead_bytes``: chunks fetched ahead
    and not opened yet, fetches in flight included; ``max_in_flight``: chunk fetches ahead at
    once; ``part_bytes``: the size of a ranged part of a large chunk (storage/chunkdownload.py);
    ``wait_s``: how long a reader waits for another process fetching the chunk it needs (beyond
    that it is taken for stuck).
    """

    keep_open_bytes: int
    max_open_bytes: int
    read_ahead_bytes: int
    max_in_flight: int
    part_bytes: int = PART_BYTES
    wait_s: float = 600.0

    def __post_init__(self) -> None:
        names = ("keep_open_bytes", "max_open_bytes", "read_ahead_bytes", "max_in_flight")
        for name in (*names, "part_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.part_bytes < 1:
            raise ValueError(f"part_bytes must be >= 1, got {self.part_bytes!r}")

    @classmethod
    def for_cache(cls, limit: int | None, max_transfers: int, wait_s: float) -> DemandSettings:
        """The defaults: an eighth of the limit kept open (up to half), half of it fetched
        ahead (the rest is left to what reads need at once, and other readers),
        ``max_transfers`` fetches in flight."""
        if limit is None:
            return cls(1 << 62, 1 << 62, _UNLIMITED_AHEAD_BYTES, max_transfers, wait_s=wait_s)
        return cls(limit // 8, limit // 2, limit // 2, max_transfers, wait_s=wait_s)


class ChunkFetcher:
    """The chunks of one bucket version, fetched into ``folder`` of the local ``cache`` when
    a reader needs them (``acquire``) or will soon (``read_ahead``); a ChunkProvider.

    ``base``: the version's key prefix in ``objects``; ``chunks``: the manifest's chunks;
    ``version``: its (dataset_id, version); ``on_fetch(bytes)``: called after each chunk
    fetched.
    Picklable (the copy in another process fetches through the same local cache, and waits
    rather than fetch a chunk another process is fetching); the object store travels as its
    own pickling allows.
    """

    def __init__(
        self,
        objects: ObjectStore,
        cache: Mirror,
        folder: str,
        base: str,
        chunks: Sequence[ChunkInfo],
        settings: DemandSettings,
        version: tuple[str, str],
        on_fetch: Callable[[int], object] | None = None,
    ) -> None:
        self.objects = objects
        self.cache = cache
        self.folder = folder
        self.base = base
        self.chunks = list(chunks)
        self.settings = settings
        self.version = version
        self.keep_open_bytes = settings.keep_open_bytes
        self.max_open_bytes = settings.max_open_bytes
        # What fetches ahead leave free for a reader's next chunk.
        self._reserve = max((c.bytes for c in self.chunks), default=0)
        #: Called with a chunk's size after each chunk fetched (progress, counting); not sent
        #: to other processes.
        self.on_fetch = on_fetch
        self._start()

    def _start(self) -> None:
        """The state of this process's fetches (none sent along when pickled)."""
        self._lock = threading.Lock()
        self._closed = False
        self._ahead_pool: ThreadPoolExecutor | None = None
        self._downloads = RangedDownload(
            VersionCopy(self.objects, self.base, self.cache, self.folder, self.version),
            chunks_at_once=self.settings.max_in_flight + 1,
            reserve=self._reserve,
            on_fetch=self.on_fetch,
        )
        # Chunks announced and not started, in the order announced (number -> order).
        self._queue: OrderedDict[int, int] = OrderedDict()
        self._announced = 0
        self._in_flight: dict[int, int] = {}  # number -> order
        self._ahead: dict[int, tuple[Pin, int]] = {}  # fetched ahead, pinned: number -> order
        self._reserved = 0  # bytes of _in_flight and _ahead
        self._opened = 0  # bytes of the chunks acquired by readers and not released
        self._failures: dict[int, BaseException] = {}
        self._no_room = False  # a fetch ahead found no room: none until a reader opens one
        _FETCHERS.add(self)

    def __getstate__(self) -> dict[str, Any]:
        keep = ("objects", "cache", "folder", "base", "chunks", "settings", "version")
        return {name: getattr(self, name) for name in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.keep_open_bytes = self.settings.keep_open_bytes
        self.max_open_bytes = self.settings.max_open_bytes
        self._reserve = max((c.bytes for c in self.chunks), default=0)
        self.on_fetch = None
        self._start()

    def __repr__(self) -> str:
        return f"ChunkFetcher({self.objects.url}/{self.base}, into {self.folder!r})"

    # --- the ChunkProvider face (cache/demand.py) ---

    def acquire(self, number: int) -> _Opened:
        """Chunk ``number`` in place, checked, and pinned until the pin is released."""
        info = self.chunks[number]
        # Pinned first: from now on nobody evicts it, whatever a fetch ahead of it does with
        # its own pin (a reader in need of room may evict chunks only fetched ahead).
        pin = self.cache.pins.chunk(self._path(info))
        with self._lock:
            self._no_room = False
            ahead = self._ahead.pop(number, None)
            if ahead is not None:
                self._reserved -= info.bytes
                order: int | None = ahead[1]
            else:
                # A fetch of it in flight finishes for us (its lock makes us wait for it),
                # and lets go of what it reserved.
                order = self._in_flight.pop(number, None)
            queued = self._queue.pop(number, None)
            order = queued if order is None else order
            if order is not None:
                self._drop_passed(order)
        began = time.monotonic()
        try:
            opened = _Opened(self, self._fetch(number, ahead=False, pin=pin), info.bytes)
        finally:
            if ahead is not None:
                ahead[0].release()
        waited = time.monotonic() - began
        if waited >= SLOW_CHUNK_SECONDS:
            log.warning(
                "waited %.0f s for chunk %s (%s bytes) of %s: the reader is waiting on the "
                "bucket (fetching %d at a time)",
                waited,
                info.file,
                f"{info.bytes:,}",
                self.folder,
                self.settings.max_in_flight,
            )
        with self._lock:
            self._opened += info.bytes
        self._pump()
        return opened

    def read_ahead(self, numbers: Sequence[int]) -> None:
        """Fetch these chunks in the background, in this order, within the settings' bounds."""
        with self._lock:
            if self._closed:
                self._closed = False  # (closed by a DataRef's close(); reading again)
            # One order for the whole call: a read opens the chunks it needs in any order.
            order = self._announced
            self._announced += 1
            for number in numbers:
                if number in self._queue or number in self._in_flight or number in self._ahead:
                    continue
                self._queue[number] = order
        self._pump()

    def close(self) -> None:
        """Forget the announced chunks and release those fetched ahead (fetches in flight
        finish and are released)."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            ahead, self._ahead = self._ahead, {}
            self._reserved -= sum(self.chunks[n].bytes for n in ahead)
        for pin, _ in ahead.values():
            pin.release()

    # --- fetching ---

    def _path(self, info: ChunkInfo) -> str:
        return os.path.join(self.folder, info.file)

    def _fetch(self, number: int, ahead: bool, pin: Pin | None = None) -> Pin:
        """Pin chunk ``number`` (unless ``pin`` holds it) and fetch it if it is not here (one
        fetcher per machine at a time). A reader's fetch (not ``ahead``) that waited for a
        fetch ahead of it which failed raises that failure rather than try again as long."""
        info = self.chunks[number]
        path = self._path(info)
        if pin is None:
            pin = self.cache.pins.chunk(path, ahead=ahead)
        try:
            if not _present(path, info):
                with self.cache.fetching(path, self.settings.wait_s):
                    with self._lock:
                        failed = self._failures.pop(number, None)
                    if failed is not None and not ahead:
                        raise failed
                    if not _present(path, info):
                        try:
                            self._downloads.fetch(info, path, ahead, self.settings.part_bytes)
                        except NoRoom:
                            raise
                        except BaseException as exc:
                            if ahead:  # recorded before the chunk's lock is let go
                                with self._lock:
                                    self._failures[number] = exc
                            raise
        except BaseException:
            pin.release()
            raise
        return pin

    # --- fetching ahead ---

    def _pump(self) -> None:
        """Start fetches ahead, in the order announced, within the bounds."""
        settings = self.settings
        limit = self.cache.limit
        starts = []
        with self._lock:
            self._drop_opened()
            while self._queue and not self._closed and not self._no_room:
                if len(self._in_flight) >= settings.max_in_flight:
                    break
                number, order = next(iter(self._queue.items()))
                size = self.chunks[number].bytes
                if self._reserved + size > settings.read_ahead_bytes:
                    break
                # What this process's readers have open, and room for their next chunk, first.
                if limit is not None and (
                    self._reserved + size + self._opened + self._reserve > limit
                ):
                    break
                del self._queue[number]
                self._in_flight[number] = order
                self._reserved += size
                starts.append(number)
            if starts and self._ahead_pool is None:
                self._ahead_pool = ThreadPoolExecutor(
                    max(1, settings.max_in_flight), "yogadl-plus-ahead"
                )
            pool = self._ahead_pool
        for number in starts:
            assert pool is not None
            future: Future[None] = pool.submit(self._fetch_ahead, number)
            del future  # its outcome is recorded by _fetch_ahead itself

    def _fetch_ahead(self, number: int) -> None:
        size = self.chunks[number].bytes
        try:
            pin = self._fetch(number, ahead=True)
        except BaseException as exc:
            # A failure is recorded for the reader that needs the chunk (_fetch); no room
            # means none until a reader opens a chunk or lets go of one (and so makes room),
            # and then this one first: it is still needed.
            with self._lock:
                order = self._in_flight.pop(number, None)
                self._reserved -= size
                if isinstance(exc, NoRoom):
                    self._no_room = True
                    if order is not None and not self._closed:
                        self._queue[number] = order
                        self._queue.move_to_end(number, last=False)
            return
        with self._lock:
            order = self._in_flight.pop(number, None)
            if self._closed or order is None:
                self._reserved -= size
                keep = False
            else:
                self._ahead[number] = (pin, order)
                keep = True
        if not keep:
            pin.release()
        self._pump()

    def _drop_passed(self, order: int) -> None:
        """The reader opened the chunk announced as ``order``: those announced before it and
        not opened were passed by (another thread reads them, or nobody will): they stop
        counting against the bound (they stay on disk while there is room). Under the lock."""
        for number in [n for n, o in self._queue.items() if o < order]:
            del self._queue[number]
        for number, (pin, announced) in list(self._ahead.items()):
            if announced < order:
                del self._ahead[number]
                self._reserved -= self.chunks[number].bytes
                pin.release()

    def _drop_opened(self) -> None:
        """Let go of chunks fetched ahead that a reader of another process (a worker this
        one announces for) opened since. Under the lock."""
        for number in [
            n for n in self._ahead if self.cache.pins.opened_since_ahead(self._path_of(n))
        ]:
            pin, _ = self._ahead.pop(number)
            self._reserved -= self.chunks[number].bytes
            pin.release()

    def _path_of(self, number: int) -> str:
        return self._path(self.chunks[number])

    def let_go(self, size: int) -> None:
        """A reader released a chunk of ``size`` bytes it had acquired: room for fetches
        ahead again."""
        with self._lock:
            self._opened = max(self._opened - size, 0)
            self._no_room = False
        self._pump()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's fetch threads are not here, its pins are its own."""
        for pin, _ in self._ahead.values():
            pin.release()
        self._start()


class _Opened:
    """A reader's pin on a chunk, counted by its fetcher while held (fetches ahead leave room
    for what readers have open)."""

    def __init__(self, fetcher: ChunkFetcher, pin: Pin, size: int) -> None:
        self.fetcher = fetcher
        self.pin = pin
        self.size = size
        self.pid = os.getpid()

    def release(self) -> None:
        # (In a forked child the parent's count is not ours, nor maybe its lock.)
        if self.size and self.pid == os.getpid():
            self.fetcher.let_go(self.size)
        self.size = 0
        self.pin.release()


def _present(path: str, info: ChunkInfo) -> bool:
    try:
        return os.path.getsize(path) == info.bytes
    except FileNotFoundError:
        return False


def check_fits(chunks: Sequence[ChunkInfo], limit: int | None, where: str) -> None:
    """StorageError unless each chunk fits the local cache on its own (one of exactly the
    limit does: the limit counts chunk bytes, mirrorfiles.py)."""
    if limit is None or not chunks:
        return
    largest = max(chunks, key=lambda c: c.bytes)
    if largest.bytes > limit:
        raise StorageError(
            f"{where}: chunk {largest.file} has {largest.bytes:,} bytes, more than the local "
            f"cache's limit of {limit:,} bytes: it cannot be read through this cache; raise "
            "local_cache_limit, or rebuild the version with a smaller chunk_bytes"
        )
