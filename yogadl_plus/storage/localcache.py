"""The local copies of remote versions on one machine: pulled once, shared by its processes,
kept under a size limit without ever removing a version a live process is reading.

Layout (a LocalStorage folder): ``<root>/<id>/<version>/`` holds the remote manifest's exact
bytes and the chunk files it names, mirrored (``b-<build>/chunk-00000.mdb``). Every process
reading the copy holds a shared ``flock`` (see pins.py; the kernel drops it when a process dies,
even by SIGKILL) on ``<root>/<id>/+pin.<version>``, whose mtime records the last use for
least-recently-used eviction, and on ``b-<build>/+pin`` of each build it reads: a copy is evicted
only when nobody reads it, and a build the manifest no longer names once nobody reads that build.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence

from filelock import FileLock, Timeout

from yogadl_plus.cache.integrity import stamp
from yogadl_plus.cache.manifest import MANIFEST_NAME, ChunkInfo, Manifest, write_durably
from yogadl_plus.checks import check_int
from yogadl_plus.errors import CacheLimitWarning, StorageError
from yogadl_plus.storage.local import LocalStorage, build_pin_path
from yogadl_plus.storage.pins import Pin, PinGone, Pins, exclusively

__all__ = ["LocalCache"]

_PIN = "+pin."
_PART = ".part"


class LocalCache:
    """Pulled copies of remote versions under ``root``, at most ``limit`` bytes (None: no limit)."""

    def __init__(self, root: str, limit: int | None = None) -> None:
        self.limit = None if limit is None else check_int("local_cache_limit", limit, 0)
        self.local = LocalStorage(root)
        self.root = self.local.root

    def path(self, dataset_id: str, version: str) -> str:
        return self.local.path(dataset_id, version)

    def _pin_path(self, dataset_id: str, version: str) -> str:
        return os.path.join(self.root, dataset_id, _PIN + version)

    def _lock_path(self, dataset_id: str, version: str) -> str:
        return self.local.lock_path(dataset_id, version)

    def sync(
        self,
        dataset_id: str,
        version: str,
        manifest_bytes: bytes,
        manifest: Manifest,
        wanted: Sequence[int],
        download: Callable[[list[tuple[ChunkInfo, str]]], None],
    ) -> tuple[str, Pins]:
        """Make the local copy match ``manifest_bytes`` with chunks ``wanted`` present, and pin it.

        One process per machine does the work; the others wait for it and reuse what it pulled.
        ``download(jobs)`` fetches and verifies each (chunk, local path) job. A copy that is
        current already is read without writing anything, so a read-only local cache works.
        """
        folder = self.path(dataset_id, version)
        ready = self._pinned_if_current(dataset_id, version, manifest_bytes, manifest, wanted)
        if ready is not None:
            return folder, ready

        def fill(folder: str, numbers: list[int]) -> None:
            self._download_into(folder, manifest, numbers, download)

        try:
            with self.local.lock(dataset_id, version):
                self._update(dataset_id, version, manifest_bytes, manifest, wanted, fill)
                return folder, self._pins(dataset_id, version, manifest)
        except StorageError as exc:
            if os.access(self.root, os.W_OK) and not _read_only(self.root):
                raise
            raise StorageError(
                f"the local cache {self.root} is read-only and does not hold {dataset_id}:"
                f"{version} as published now (chunks missing, or an older build): make it "
                "writable, or give the storage another local_cache"
            ) from exc

    def _pinned_if_current(
        self,
        dataset_id: str,
        version: str,
        manifest_bytes: bytes,
        manifest: Manifest,
        wanted: Sequence[int],
    ) -> Pins | None:
        """Pins on the local copy if it is this manifest's with ``wanted`` present, else None;
        takes no lock and writes nothing but the pins' time of last use."""
        folder = self.path(dataset_id, version)
        if _read_bytes(os.path.join(folder, MANIFEST_NAME)) != manifest_bytes:
            return None
        if _unnamed_builds(folder, manifest):
            # Old builds nobody reads any more: removed before we pin the copy ourselves.
            lock = FileLock(self._lock_path(dataset_id, version), thread_local=False)
            with contextlib.suppress(Timeout, OSError), lock.acquire(timeout=0):
                self._drop_unnamed_builds(dataset_id, version, manifest)
        try:
            pins = self._pins(dataset_id, version, manifest)
        except PinGone:
            return None  # being evicted, or its old build removed, right now
        current = _read_bytes(os.path.join(folder, MANIFEST_NAME)) == manifest_bytes
        if current and not _missing(folder, manifest, wanted):
            return pins
        pins.release()
        return None

    def _pins(self, dataset_id: str, version: str, manifest: Manifest) -> Pins:
        """What a reader of the copy holds: the copy's pin (no eviction while it is held; its
        time is the copy's last use) and one on each build it reads (an old build goes once
        none of its readers is left, while readers of the new one read on)."""
        folder = self.path(dataset_id, version)
        pins = [Pin(self._pin_path(dataset_id, version), touch=True)]
        try:
            pins.extend(Pin(build_pin_path(folder, b)) for b in _builds(manifest))
        except PinGone:
            Pins(pins).release()
            raise
        return Pins(pins)

    def adopt(
        self, dataset_id: str, version: str, manifest_bytes: bytes, manifest: Manifest, built: str
    ) -> None:
        """Make the chunk files a builder just uploaded from ``built`` (flat, as written) the
        local copy, so the building machine never downloads them."""

        def fill(folder: str, numbers: list[int]) -> None:
            for number in numbers:
                info = manifest.chunks[number]
                target = os.path.join(folder, info.file)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(os.path.join(built, os.path.basename(info.file)), target)
                stamp(target, info.sha256)  # our own file, checked when it was written

        with self.local.lock(dataset_id, version):
            everything = range(len(manifest.chunks))
            self._update(dataset_id, version, manifest_bytes, manifest, everything, fill)

    def _update(
        self,
        dataset_id: str,
        version: str,
        manifest_bytes: bytes,
        manifest: Manifest,
        wanted: Sequence[int],
        fill: Callable[[str, list[int]], None],
    ) -> None:
        """Under the version's lock: bring the copy to ``manifest_bytes`` with ``wanted`` present.

        Each build's chunks live in their own ``b-<build>/`` folder, so a new build's files go
        next to the old ones, the manifest is written (or replaced) atomically once they are
        all there, and the old build's files are removed only when no process is reading them
        (processes that opened the old manifest keep reading the old files). A folder without
        a manifest is no copy yet: a crash while filling it leaves nothing anyone reads.
        """
        folder = self.path(dataset_id, version)
        os.makedirs(folder, exist_ok=True)
        current = _read_bytes(os.path.join(folder, MANIFEST_NAME))
        _remove_partial_downloads(folder)
        missing = _missing(folder, manifest, wanted)
        if missing:
            self._make_room(_size(manifest, missing), keep=(dataset_id, version))
            fill(folder, missing)
        if current != manifest_bytes:
            write_durably(os.path.join(folder, MANIFEST_NAME), manifest_bytes)
        self._drop_unnamed_builds(dataset_id, version, manifest)

    def _drop_unnamed_builds(self, dataset_id: str, version: str, manifest: Manifest) -> None:
        """Remove the build folders the manifest does not name that no process reads (the
        others go at a later update or pull, once their readers are done)."""
        folder = self.path(dataset_id, version)
        for build in _unnamed_builds(folder, manifest):
            with exclusively(build_pin_path(folder, build)) as free:
                if free:
                    shutil.rmtree(os.path.join(folder, build), ignore_errors=True)

    @staticmethod
    def _download_into(
        folder: str,
        manifest: Manifest,
        numbers: list[int],
        download: Callable[[list[tuple[ChunkInfo, str]]], None],
    ) -> None:
        jobs = []
        for number in numbers:
            info = manifest.chunks[number]
            final = os.path.join(folder, info.file)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            jobs.append((info, final + _PART))
        try:
            download(jobs)
        except BaseException:
            for _, part in jobs:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(part)
            raise
        for info, part in jobs:
            final = part[: -len(_PART)]
            os.replace(part, final)
            stamp(final, info.sha256)  # checked as it was downloaded

    def copies(self) -> Iterator[tuple[str, str, int, float]]:
        """(dataset_id, version, bytes present, last use) of every local copy."""
        for dataset_id, version in self.local.list():
            folder = self.path(dataset_id, version)
            size = _tree_bytes(folder)
            pin = self._pin_path(dataset_id, version)
            try:
                used = os.path.getmtime(pin)
            except FileNotFoundError:
                used = 0.0
            yield dataset_id, version, size, used

    def _make_room(self, need: int, keep: tuple[str, str]) -> None:
        """Evict least-recently-used copies not in use until ``need`` more bytes fit the limit."""
        self.local.remove_discarded()
        if self.limit is None:
            return
        copies = sorted(self.copies(), key=lambda c: c[3])
        total = sum(c[2] for c in copies)
        busy = []
        for dataset_id, version, size, _ in copies:
            if total + need <= self.limit:
                return
            if (dataset_id, version) == keep:
                continue
            if self._evict(dataset_id, version):
                total -= size
            else:
                busy.append(f"{dataset_id}:{version}")
        if total + need > self.limit:
            warnings.warn(
                f"the local cache {self.root} needs {total + need:,} bytes, over its limit of "
                f"{self.limit:,}: the copies left are in use by live processes "
                f"({', '.join(busy) or 'none'}) or being pulled now",
                CacheLimitWarning,
                stacklevel=3,
            )

    def _evict(self, dataset_id: str, version: str) -> bool:
        """Remove one copy if no process is pulling or reading it; whether it was removed."""
        lock = FileLock(self._lock_path(dataset_id, version), thread_local=False)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        try:
            with exclusively(self._pin_path(dataset_id, version)) as free:
                if free:
                    self.local.discard(dataset_id, version)
                return free
        finally:
            lock.release()

    def remove(self, dataset_id: str, version: str) -> None:
        """Drop the local copy if there is one (readers with open files keep reading them)."""
        with self.local.lock(dataset_id, version):
            if os.path.isdir(self.path(dataset_id, version)):
                self.local.discard(dataset_id, version)


def _builds(manifest: Manifest) -> list[str]:
    """The build folders a remote manifest's chunks live in."""
    return sorted({c.file.split("/", 1)[0] for c in manifest.chunks if "/" in c.file})


def _unnamed_builds(folder: str, manifest: Manifest) -> list[str]:
    """The build folders of a local copy that its manifest does not name."""
    named = set(_builds(manifest))
    try:
        return [e.name for e in os.scandir(folder) if e.is_dir() and e.name not in named]
    except OSError:
        return []


def _tree_bytes(folder: str) -> int:
    """Bytes of the files under ``folder``; files that vanish meanwhile count as 0."""
    size = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                size += os.path.getsize(os.path.join(dirpath, name))
    return size


def _remove_partial_downloads(folder: str) -> None:
    """Downloads of a killed process: our ``.part`` files and the client's temp files beside
    them (``chunk.mdb.part.<random>``)."""
    for dirpath, _, files in os.walk(folder):
        for name in files:
            if name.endswith(_PART) or _PART + "." in name:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(dirpath, name))


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _missing(folder: str, manifest: Manifest, wanted: Sequence[int]) -> list[int]:
    out = []
    for number in wanted:
        info = manifest.chunks[number]
        try:
            present = os.path.getsize(os.path.join(folder, info.file)) == info.bytes
        except FileNotFoundError:
            present = False
        if not present:
            out.append(number)
    return out


def _size(manifest: Manifest, numbers: Sequence[int]) -> int:
    return sum(manifest.chunks[n].bytes for n in numbers)


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
