"""The local copies of remote versions on one machine: pulled once, shared by its processes,
kept under a size limit without ever removing a version a live process is reading.

Layout (a LocalStorage folder): ``<root>/<id>/<version>/`` holds the remote manifest's exact
bytes and the chunk files it names, mirrored; ``<root>/<id>/+pin.<version>`` is held with a
shared ``flock`` by every process reading that copy (the kernel drops it when a process dies,
even by SIGKILL), and its mtime records the last use for least-recently-used eviction.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

from filelock import FileLock, Timeout

from yogadl_plus.cache.manifest import MANIFEST_NAME, ChunkInfo, Manifest, write_durably
from yogadl_plus.checks import check_int
from yogadl_plus.errors import CacheLimitWarning
from yogadl_plus.storage.local import LocalStorage

__all__ = ["LocalCache", "Pin"]

_PIN = "+pin."
_PART = ".part"


class Pin:
    """A shared lock on one local copy, held while a DataRef reads it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: BinaryIO | None = open(path, "a+b")  # noqa: SIM115 - held for the pin's life
        fcntl.flock(self._file.fileno(), fcntl.LOCK_SH)
        os.utime(path)  # last use, for eviction

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing drops the flock
            self._file = None

    def __del__(self) -> None:
        self.release()


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

    def sync(
        self,
        dataset_id: str,
        version: str,
        manifest_bytes: bytes,
        manifest: Manifest,
        wanted: Sequence[int],
        download: Callable[[list[tuple[ChunkInfo, str]]], None],
    ) -> tuple[str, Pin]:
        """Make the local copy match ``manifest_bytes`` with chunks ``wanted`` present, and pin it.

        One process per machine does the work; the others wait for it and reuse what it pulled.
        ``download(jobs)`` fetches and verifies each (chunk, local path) job.
        """

        def fill(folder: str, numbers: list[int]) -> None:
            self._download_into(folder, manifest, numbers, download)

        with self.local._builder_lock(dataset_id, version):
            self._update(dataset_id, version, manifest_bytes, manifest, wanted, fill)
            return self.path(dataset_id, version), Pin(self._pin_path(dataset_id, version))

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

        with self.local._builder_lock(dataset_id, version):
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

        A first copy is built in staging and renamed into place. An existing copy is updated in
        place: each build's chunks live in their own ``b-<build>/`` folder, so the new build's
        files go next to the old ones, the manifest is replaced atomically, and the old build's
        files are removed only when no process is reading them (processes that opened the old
        manifest keep reading the old files).
        """
        folder = self.path(dataset_id, version)
        current = _read_bytes(os.path.join(folder, MANIFEST_NAME))
        if current is None:
            self._make_room(_size(manifest, wanted), keep=(dataset_id, version))
            with self.local._staging(dataset_id, version, replace=False) as new:
                fill(new, list(wanted))
                write_durably(os.path.join(new, MANIFEST_NAME), manifest_bytes)
            return
        _remove_partial_downloads(folder)
        missing = _missing(folder, manifest, wanted)
        if missing:
            self._make_room(_size(manifest, missing), keep=(dataset_id, version))
            fill(folder, missing)
        if current != manifest_bytes:
            write_durably(os.path.join(folder, MANIFEST_NAME), manifest_bytes)
        self._drop_unnamed_builds(dataset_id, version, manifest)

    def _drop_unnamed_builds(self, dataset_id: str, version: str, manifest: Manifest) -> None:
        """Remove build folders the manifest does not name, if no process reads this copy."""
        folder = self.path(dataset_id, version)
        named = {c.file.split("/", 1)[0] for c in manifest.chunks if "/" in c.file}
        stale = [e.path for e in os.scandir(folder) if e.is_dir() and e.name not in named]
        if not stale:
            return
        with open(self._pin_path(dataset_id, version), "a+b") as pin:
            try:
                fcntl.flock(pin.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # someone reads the old build: the next update removes it
            for path in stale:
                shutil.rmtree(path, ignore_errors=True)

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
        for _, part in jobs:
            os.replace(part, part[: -len(_PART)])

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
        lock = FileLock(os.path.join(self.root, dataset_id, "+lock." + version), thread_local=False)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        try:
            with open(self._pin_path(dataset_id, version), "a+b") as pin:
                try:
                    fcntl.flock(pin.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                self.local.discard(dataset_id, version)
                return True
        finally:
            lock.release()

    def remove(self, dataset_id: str, version: str) -> None:
        """Drop the local copy if there is one (readers with open files keep reading them)."""
        with self.local._builder_lock(dataset_id, version):
            if os.path.isdir(self.path(dataset_id, version)):
                self.local.discard(dataset_id, version)


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
