"""The local copies of remote versions on one machine: pulled once, shared by its processes,
kept under a size limit without ever removing a version a live process is reading.

The files of a copy and its pins are described in mirrorfiles.py; the pins are taken through
mirrorpins.py, and room is made by eviction.py. A version read on demand (storage/ondemand.py)
is a copy with only some chunks present, fetched one by one as readers need them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from yogadl_plus.cache.integrity import stamp
from yogadl_plus.cache.manifest import MANIFEST_NAME, ChunkInfo, Manifest
from yogadl_plus.checks import check_int
from yogadl_plus.deprecation import old_names
from yogadl_plus.errors import PinGone, StorageError
from yogadl_plus.files import write_durably
from yogadl_plus.storage.eviction import MirrorSpace
from yogadl_plus.storage.local import LocalStorage, build_pin_path
from yogadl_plus.storage.mirrorfiles import CHUNK_LOCK, PART, holding
from yogadl_plus.storage.mirrorpins import MirrorPins, builds
from yogadl_plus.storage.pins import Pins, exclusively

__all__ = ["Mirror", "RemoteManifest"]

if not TYPE_CHECKING:  # its names of the last release, with a DeprecationWarning
    __getattr__ = old_names(__name__)


@dataclasses.dataclass(frozen=True)
class RemoteManifest:
    """A version's manifest as its bucket holds it: a local copy holds these exact bytes."""

    dataset_id: str
    version: str
    data: bytes
    manifest: Manifest

    def is_in(self, folder: str) -> bool:
        """Whether the copy in ``folder`` holds this manifest now."""
        return _read_bytes(os.path.join(folder, MANIFEST_NAME)) == self.data


class Mirror:
    """Pulled copies of remote versions under ``root``, at most ``limit`` bytes of chunks (None:
    no limit; their bookkeeping beside them is not counted, see mirrorfiles.py)."""

    def __init__(self, root: str, limit: int | None = None) -> None:
        self.limit = None if limit is None else check_int("local_cache_limit", limit, 0)
        self.local = LocalStorage(root)
        self.root = self.local.root
        self.pins = MirrorPins(self.root)
        self.space = MirrorSpace(self.local, self.pins, self.limit)

    def path(self, dataset_id: str, version: str) -> str:
        return self.local.path(dataset_id, version)

    def sync(
        self,
        remote: RemoteManifest,
        wanted: Sequence[int],
        download: Callable[[list[tuple[ChunkInfo, str]]], None],
    ) -> tuple[str, Pins]:
        """Make the local copy match ``remote`` with chunks ``wanted`` present, and pin it.

        One process per machine does the work; the others wait for it and reuse what it pulled.
        ``download(jobs)`` fetches and verifies each (chunk, local path) job. A copy that is
        current already is read without writing anything, so a read-only local cache works.
        """
        dataset_id, version = remote.dataset_id, remote.version
        folder = self.path(dataset_id, version)
        ready = self._pinned_if_current(remote, wanted)
        if ready is not None:
            return folder, ready

        def fill(folder: str, numbers: list[int]) -> None:
            self._download_into(folder, remote.manifest, numbers, download)

        try:
            with self.local.lock(dataset_id, version):
                self._update(remote, wanted, fill)
                return folder, self.pins.readers(dataset_id, version, remote.manifest)
        except StorageError as exc:
            if os.access(self.root, os.W_OK) and not _read_only(self.root):
                raise
            raise StorageError(
                f"the local cache {self.root} is read-only and does not hold {dataset_id}:"
                f"{version} as published now (chunks missing, or an older build): make it "
                "writable, or give the storage another local_cache"
            ) from exc

    def _pinned_if_current(self, remote: RemoteManifest, wanted: Sequence[int]) -> Pins | None:
        """Pins on the local copy if it is ``remote``'s with ``wanted`` present, else None;
        takes no lock and writes nothing but the pins' time of last use."""
        dataset_id, version, manifest = remote.dataset_id, remote.version, remote.manifest
        folder = self.path(dataset_id, version)
        if not remote.is_in(folder):
            return None
        if _unnamed_builds(folder, manifest):
            # Old builds nobody reads any more: removed before we pin the copy ourselves.
            with (
                contextlib.suppress(OSError),
                self.local.version_lock(dataset_id, version, wait=False) as held,
            ):
                if held:
                    self._drop_unnamed_builds(folder, manifest)
        try:
            pins = self.pins.readers(dataset_id, version, manifest)
        except PinGone:
            return None  # being evicted, or its old build removed, right now
        if remote.is_in(folder) and not _missing(folder, manifest, wanted):
            return pins
        pins.release()
        return None

    def adopt(self, remote: RemoteManifest, built: str) -> None:
        """Make the chunk files a builder just uploaded from ``built`` (flat, as written) the
        local copy of ``remote``, so the building machine never downloads them."""
        manifest = remote.manifest

        def fill(folder: str, numbers: list[int]) -> None:
            for number in numbers:
                info = manifest.chunks[number]
                target = os.path.join(folder, info.file)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(os.path.join(built, os.path.basename(info.file)), target)
                stamp(target, info.sha256)  # our own file, checked when it was written

        with self.local.lock(remote.dataset_id, remote.version):
            self._update(remote, range(len(manifest.chunks)), fill)

    def _update(
        self,
        remote: RemoteManifest,
        wanted: Sequence[int],
        fill: Callable[[str, list[int]], None],
    ) -> None:
        """Under the version's lock: bring the copy to ``remote`` with ``wanted`` present.

        Each build's chunks live in their own ``b-<build>/`` folder, so a new build's files go
        next to the old ones, the manifest is written (or replaced) atomically once they are
        all there, and the old build's files are removed only when no process is reading them
        (processes that opened the old manifest keep reading the old files). A folder without
        a manifest is no copy yet: a crash while filling it leaves nothing anyone reads.
        """
        manifest = remote.manifest
        folder = self.path(remote.dataset_id, remote.version)
        os.makedirs(folder, exist_ok=True)
        current = remote.is_in(folder)
        _remove_partial_downloads(folder)
        missing = _missing(folder, manifest, wanted)
        if missing:
            size = sum(manifest.chunks[n].bytes for n in missing)
            self.space.make_room(size, keep=(remote.dataset_id, remote.version))
            fill(folder, missing)
        if not current:
            write_durably(os.path.join(folder, MANIFEST_NAME), remote.data)
        self._drop_unnamed_builds(folder, manifest)

    @staticmethod
    def _drop_unnamed_builds(folder: str, manifest: Manifest) -> None:
        """Remove the build folders of the copy in ``folder`` that ``manifest`` does not name
        and no process reads (the others go at a later update or pull, once their readers are
        done)."""
        for build in _unnamed_builds(folder, manifest):
            with exclusively(build_pin_path(folder, build)) as free:
                if free:
                    shutil.rmtree(os.path.join(folder, build), ignore_errors=True)

    def _download_into(
        self,
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
            jobs.append((info, final + PART))
        try:
            download(jobs)
        except BaseException:
            for _, part in jobs:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(part)
            raise
        for info, part in jobs:
            final = part[: -len(PART)]
            # A reader on demand may have fetched it meanwhile (and may have it open): keep it.
            with self.space.lock():
                if _place(part, final):
                    stamp(final, info.sha256)  # checked as it was downloaded

    def copies(self) -> Iterator[tuple[str, str, int, float]]:
        """(dataset_id, version, bytes present, last use) of every local copy."""
        for dataset_id, version in self.local.list():
            folder = self.path(dataset_id, version)
            size = _tree_bytes(folder)
            pin = self.pins.copy(dataset_id, version)
            try:
                used = os.path.getmtime(pin)
            except FileNotFoundError:
                used = 0.0
            yield dataset_id, version, size, used

    # --- reading on demand ---

    def open_on_demand(self, remote: RemoteManifest) -> tuple[str, Pins]:
        """The local copy of ``remote`` with the chunks it holds (none pulled now), pinned for
        reading on demand: not evicted as a whole while pinned, though chunks nobody pins may
        be (see MirrorPins.chunk)."""
        dataset_id, version, manifest = remote.dataset_id, remote.version, remote.manifest
        folder = self.path(dataset_id, version)
        if remote.is_in(folder):
            with contextlib.suppress(PinGone):
                pins = self.pins.readers(dataset_id, version, manifest, on_demand=True)
                if remote.is_in(folder):
                    return folder, pins
                pins.release()
        with self.local.lock(dataset_id, version):  # (a manifest takes no room: mirrorfiles.py)
            self._update(remote, (), _nothing)
            for build in builds(manifest):  # (where its chunks and their pins will be)
                os.makedirs(os.path.join(folder, build), exist_ok=True)
            return folder, self.pins.readers(dataset_id, version, manifest, on_demand=True)

    @contextlib.contextmanager
    def fetching(self, path: str, timeout: float) -> Iterator[None]:
        """Held by the one thread of this machine fetching the chunk file ``path``; the others
        wait for it (at most ``timeout`` seconds, then a StorageError)."""
        lock_file = path + CHUNK_LOCK
        stuck = (
            f"{path}: another process or thread has been fetching this chunk for "
            f"{timeout:.0f} s (it holds {lock_file}); is it stopped? try again"
        )
        with holding(lock_file, timeout, stuck):
            yield

    def remove(self, dataset_id: str, version: str) -> None:
        """Drop the local copy if there is one (readers with open files keep reading them)."""
        with self.local.lock(dataset_id, version):
            if os.path.isdir(self.path(dataset_id, version)):
                self.local.discard(dataset_id, version)


def _nothing(folder: str, numbers: list[int]) -> None:
    """Fills no chunk (reading on demand fetches them when they are read)."""


def _place(part: str, final: str) -> bool:
    """Rename ``part`` to ``final`` unless ``final`` exists (a reader on demand fetched it
    meanwhile, and may have it open: the same bytes, checked); whether it was placed."""
    try:
        os.link(part, final)
    except FileExistsError:
        os.remove(part)
        return False
    except OSError:  # no hard links here
        if os.path.exists(final):
            os.remove(part)
            return False
        os.replace(part, final)
        return True
    os.remove(part)
    return True


def _unnamed_builds(folder: str, manifest: Manifest) -> list[str]:
    """The build folders of a local copy that its manifest does not name."""
    named = set(builds(manifest))
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
            if name.endswith(PART) or PART + "." in name:
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


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
