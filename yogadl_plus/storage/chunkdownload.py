"""Downloading the chunk files of a bucket's version, each checked against its manifest entry:
whole, into a local copy being pulled, or in ranged parts into the bounded local cache, for a
version read on demand.

A download that does not match its manifest entry is made again before the object is blamed
(``checked_download``): bytes damaged on the way (a flaky network card, a proxy) come right the
next time, and the warning says so; an object damaged in the bucket gives the same wrong bytes
every time, and the error says that, apart from bytes that keep arriving damaged in other ways.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from yogadl_plus.cache.integrity import check_chunk, stamp
from yogadl_plus.cache.manifest import ChunkInfo
from yogadl_plus.errors import CacheCorrupted, YogaError, unwritable
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
    "download_chunks",
]

log = logging.getLogger(__name__)

PART_BYTES = 8 << 20  # a ranged read of a large chunk
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
) -> None:
    """Download each (chunk, local path) job of the version under key prefix ``base``, in at
    most ``threads`` threads, and check it; ``on_transfer(bytes)`` after each."""

    def one(job: tuple[ChunkInfo, str]) -> None:
        info, path = job
        key = base + info.file
        checked_download(lambda: objects.download(key, path), path, info, f"{objects.url}/{key}")
        if on_transfer is not None:
            on_transfer(info.bytes)

    began = time.monotonic()
    in_threads(one, jobs, threads)
    if jobs:
        log.info(
            "pulled %d chunk(s) of %s: %s records, %s bytes, %.1f s",
            len(jobs),
            f"{objects.url}/{base}",
            f"{sum(info.records for info, _ in jobs):,}",
            f"{sum(info.bytes for info, _ in jobs):,}",
            time.monotonic() - began,
        )


def checked_download(download: Callable[[], None], path: str, info: ChunkInfo, where: str) -> None:
    """``download()`` (which writes chunk ``info`` to ``path``), checked against the manifest
    entry; made again, up to DOWNLOAD_TRIES times in all, while it does not match. Raises
    CacheCorrupted naming ``where`` and saying which damage it is: the same wrong bytes every
    time (the object in the bucket), or other bytes each time (on the way)."""
    found: list[str] = []  # what each download that did not match was (its size or sha256)
    for attempt in range(1, DOWNLOAD_TRIES + 1):
        try:
            download()
            check_chunk(path, info, where, DAMAGED_OBJECT, "the download is not the chunk")
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
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

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
                lambda: self._read_parts(key, where, info, part, part_bytes), part, info, where
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

    def _read_parts(self, key: str, where: str, info: ChunkInfo, part: str, step: int) -> None:
        size = info.bytes
        spans = [(start, min(start + step, size)) for start in range(0, size, step)]
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise unwritable(part, exc) from None

        def one(span: tuple[int, int]) -> None:
            data = self.copy.objects.read_range(key, *span)
            if len(data) != span[1] - span[0]:
                raise CacheCorrupted(
                    f"chunk {where} ends before byte {span[1]:,}, the manifest says it has "
                    f"{size:,} bytes; {DAMAGED_OBJECT}"
                )
            try:
                os.pwrite(fd, data, span[0])
            except OSError as exc:
                raise unwritable(part, exc) from None

        try:
            if len(spans) <= 1:
                for span in spans:
                    one(span)
                return
            run_all(self._parts(), one, spans)  # (it waits: none writes after the close)
        finally:
            os.close(fd)

    def _parts(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                workers = max(1, self.chunks_at_once) * _PARTS_PER_CHUNK
                self._pool = ThreadPoolExecutor(workers, "yogadl-plus-part")
            return self._pool
