"""Downloading the chunk files of a bucket's version, each checked against its manifest entry,
into a local copy being pulled or into the bounded local cache for a version read on demand.

A chunk's bytes are written at their place in its file as they arrive. One under two ranged
parts is read whole and hashed on the way (never read back); a larger one is read in ranged
parts in parallel, then hashed from its file.

A download that does not match its manifest entry is made again before the object is blamed
(``checked_download``): bytes damaged on the way (a flaky network card, a proxy) come right the
next time, and the warning says so; an object damaged in the bucket gives the same wrong bytes
every time, and the error says that, apart from bytes that keep arriving damaged in other ways.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor

from yogadl_plus.cache.integrity import check_chunk, check_hashed, stamp
from yogadl_plus.cache.manifest import ChunkInfo
from yogadl_plus.errors import CacheCorrupted, StorageError, YogaError, unwritable
from yogadl_plus.storage.mirror import Mirror
from yogadl_plus.storage.mirrorfiles import FETCHING
from yogadl_plus.storage.objects import ObjectStore
from yogadl_plus.storage.parallel import in_threads, run_all

__all__ = [
    "DAMAGED_OBJECT",
    "PART_BYTES",
    "RangedDownload",
    "VersionCopy",
    "checked_download",
    "download_chunk",
    "download_chunks",
]

log = logging.getLogger(__name__)

PART_BYTES = 8 << 20  # a ranged read of a large chunk (one under twice this is read whole)
_PARTS_PER_CHUNK = 4  # ranged reads of one chunk in flight at once
# What to do about a chunk whose download does not match the manifest.
DAMAGED_OBJECT = (
    "the object in the bucket is damaged: nothing was kept; rebuild the version (overwrite=True)"
)
# Downloads of a chunk that does not match its manifest entry, before it is blamed.
DOWNLOAD_TRIES = 3

OnTransfer = Callable[[int], object] | None


def download_chunks(
    objects: ObjectStore,
    base: str,
    jobs: list[tuple[ChunkInfo, str]],
    threads: int,
    on_transfer: OnTransfer = None,
    part_bytes: int = PART_BYTES,
) -> None:
    """Download each (chunk, local path) job of the version under key prefix ``base``, in at
    most ``threads`` threads (large chunks in ranged parts, ``_PARTS_PER_CHUNK`` of them at
    once per thread), and check it; ``on_transfer(bytes)`` after each."""
    parts = _PartPool(max(1, min(threads, len(jobs))) * _PARTS_PER_CHUNK)

    def one(job: tuple[ChunkInfo, str]) -> None:
        info, path = job
        key = base + info.file

        def download() -> str | None:
            _file_of_size(path, info.bytes)
            return download_chunk(objects, key, info, path, part_bytes, parts)

        checked_download(download, path, info, f"{objects.url}/{key}")
        if on_transfer is not None:
            on_transfer(info.bytes)

    began = time.monotonic()
    try:
        in_threads(one, jobs, threads)
    finally:
        parts.shutdown()
    if jobs:
        log.info(
            "pulled %d chunk(s) of %s: %s records, %s bytes, %.1f s",
            len(jobs),
            f"{objects.url}/{base}",
            f"{sum(info.records for info, _ in jobs):,}",
            f"{sum(info.bytes for info, _ in jobs):,}",
            time.monotonic() - began,
        )


def _file_of_size(path: str, size: int) -> None:
    """A new file ``path`` of ``size`` bytes (zeros), for a download to write into."""
    try:
        with open(path, "wb") as f:
            f.truncate(size)
    except OSError as exc:
        raise unwritable(path, exc) from None


def checked_download(
    download: Callable[[], str | None], path: str, info: ChunkInfo, where: str
) -> None:
    """``download()`` (which writes chunk ``info`` to ``path`` and returns the sha256 of the
    bytes it wrote, hashed on their way, or None: then the file is read back and hashed),
    checked against the manifest entry; made again, up to DOWNLOAD_TRIES times in all, while it
    does not match. Raises CacheCorrupted naming ``where`` and saying which damage it is: the
    same wrong bytes every time (the object in the bucket), or other bytes each time (on the
    way)."""
    found: list[str] = []  # what each download that did not match was (its size or sha256)
    changed = "the download is not the chunk"
    for attempt in range(1, DOWNLOAD_TRIES + 1):
        try:
            hashed = download()
            if hashed is None:
                check_chunk(path, info, where, DAMAGED_OBJECT, changed)
            else:  # (its size is checked as it arrives: _SpanWriter)
                check_hashed(info.bytes, hashed, info, where, DAMAGED_OBJECT, changed)
        except CacheCorrupted as exc:
            found.append(str(exc).removesuffix(DAMAGED_OBJECT).rstrip("; "))
            if attempt < DOWNLOAD_TRIES:
                log.warning(
                    "%s: fetching it again (download %d of %d)", found[-1], attempt, DOWNLOAD_TRIES
                )
                continue
            if len(set(found)) == 1:
                raise CacheCorrupted(
                    f"{found[0]}; {attempt} downloads gave these same bytes: {DAMAGED_OBJECT}"
                ) from None
            raise CacheCorrupted(
                f"chunk {where} arrived damaged {attempt} times, other bytes each time: "
                f"{' / '.join(found)}. The bytes are damaged on the way (the network, a proxy, "
                "this machine's memory or disk); the object in the bucket may be whole. "
                "Nothing was kept"
            ) from None
        if found:
            log.warning(
                "chunk %s arrived whole on download %d: it had been damaged on the way",
                where,
                attempt,
            )
        return


def download_chunk(
    objects: ObjectStore,
    key: str,
    info: ChunkInfo,
    path: str,
    part_bytes: int,
    parts: Callable[[], Executor],
) -> str | None:
    """Write chunk ``info``, object ``key`` of ``objects``, into the file ``path`` (which has
    its full size already): whole in one read, hashed on the way (its sha256 is returned),
    where it is under two ``part_bytes``; else in ranged parts of ``part_bytes`` to twice that,
    read in parallel on the pool ``parts()`` (None is returned: the caller hashes the file)."""
    size = info.bytes
    where = f"{objects.url}/{key}"
    count = max(1, size // part_bytes)
    bounds = [size * k // count for k in range(count + 1)]
    spans = list(itertools.pairwise(bounds))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise unwritable(path, exc) from None

    def one(span: tuple[int, int]) -> _SpanWriter:
        out = _SpanWriter(fd, path, where, span, hashing=len(spans) == 1)
        objects.read_range_into(key, *span, out)
        if out.written < span[1] - span[0]:
            raise CacheCorrupted(
                f"chunk {where} ends before byte {span[1]:,}, the manifest says it has "
                f"{size:,} bytes; {DAMAGED_OBJECT}"
            )
        return out

    try:
        if len(spans) == 1:
            return one(spans[0]).hexdigest()
        run_all(parts(), one, spans)  # (it waits: none writes after the close)
        return None
    finally:
        os.close(fd)


class _SpanWriter:
    """A RangeSink writing bytes ``span`` of a chunk (``where``, for messages) at their place in
    its file (descriptor ``fd``, opened for writing, named ``path``); ``hashing``: the span is
    the whole chunk, hashed as it arrives (so that the file need not be read back)."""

    def __init__(
        self, fd: int, path: str, where: str, span: tuple[int, int], hashing: bool
    ) -> None:
        self.fd = fd
        self.path = path
        self.where = where
        self.start, self.stop = span
        self.hashing = hashing
        self.seek(0)

    def seek(self, offset: int, whence: int = 0, /) -> int:
        if offset or whence:
            raise ValueError("a span is written from its start only (seek(0))")
        self.written = 0
        self._sha256 = hashlib.sha256() if self.hashing else None
        return 0

    def tell(self) -> int:
        return self.written

    def write(self, data: bytes, /) -> int:
        if self.start + self.written + len(data) > self.stop:  # never into another's span
            raise StorageError(
                f"{self.where}: the store sent more than the bytes {self.start:,} to "
                f"{self.stop:,} it was asked for: it does not honour ranged reads (HTTP Range "
                "headers); check endpoint_url and any proxy in between"
            )
        view = memoryview(data)
        try:
            while view:
                done = os.pwrite(self.fd, view, self.start + self.written)
                self.written += done
                view = view[done:]
        except OSError as exc:
            raise unwritable(self.path, exc) from None
        if self._sha256 is not None:
            self._sha256.update(data)
        return len(data)

    def hexdigest(self) -> str | None:
        """The sha256 of what was written since the last ``seek(0)``, if hashing."""
        return None if self._sha256 is None else self._sha256.hexdigest()


@dataclasses.dataclass(frozen=True)
class VersionCopy:
    """A version in a bucket and its copy in a machine's local cache, read on demand: the
    version's objects are under key prefix ``base`` in ``objects``, its copy is ``folder`` of
    ``cache``, and ``version`` is its (dataset_id, version)."""

    objects: ObjectStore
    base: str
    cache: Mirror
    folder: str
    version: tuple[str, str]


class RangedDownload:
    """Chunks of a version fetched one by one into its ``copy``: room made for each first
    (the copy is never evicted whole meanwhile), ranged parts read in parallel into a file of
    its full size, the sha256 checked, then renamed into place. ``chunks_at_once``: how many
    chunks may be fetched at the same time (their parts share a pool of threads);
    ``reserve``: the room fetches ahead leave free for a reader's next chunk;
    ``on_fetch(bytes)``: called after each chunk fetched."""

    def __init__(
        self,
        copy: VersionCopy,
        *,
        chunks_at_once: int,
        reserve: int,
        on_fetch: OnTransfer = None,
    ) -> None:
        self.copy = copy
        self.chunks_at_once = chunks_at_once
        self.reserve = reserve
        self.on_fetch = on_fetch
        self._parts = _PartPool(max(1, chunks_at_once) * _PARTS_PER_CHUNK)

    def fetch(self, info: ChunkInfo, path: str, strict: bool, part_bytes: int) -> None:
        """Fetch chunk ``info`` into ``path`` (the caller holds the chunk's lock) in ranged
        reads of ``part_bytes``. ``strict``: NoRoom rather than go over the cache's limit
        (fetches ahead)."""
        copy = self.copy
        key = copy.base + info.file
        where = f"{copy.objects.url}/{key}"
        part = path + FETCHING
        with contextlib.suppress(FileNotFoundError):
            os.remove(part)  # what a killed fetch left (we hold the chunk's lock)
        try:
            room = copy.cache.space.room(
                info.bytes, copy.version, strict=strict, reserve=self.reserve
            )
            with room, open(part, "wb") as f:
                f.truncate(info.bytes)
        except OSError as exc:
            if isinstance(exc, YogaError):
                raise
            raise unwritable(part, exc) from None
        try:
            checked_download(
                lambda: download_chunk(copy.objects, key, info, part, part_bytes, self._parts),
                part,
                info,
                where,
            )
            with copy.cache.space.lock():
                os.replace(part, path)
                stamp(path, info.sha256)  # checked as it was fetched
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(part)
            raise
        if self.on_fetch is not None:
            self.on_fetch(info.bytes)


class _PartPool:
    """The threads reading the ranged parts of large chunks (``workers`` of them), started
    when the first is needed."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def __call__(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, "yogadl-plus-part")
            return self._pool

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()
