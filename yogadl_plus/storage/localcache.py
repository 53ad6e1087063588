"""The local copies of remote versions on one machine: pulled once, shared by its processes,
kept under a size limit without ever removing a version a live process is reading.

Layout (a LocalStorage folder): ``<root>/<id>/<version>/`` holds the remote manifest's exact
bytes and the chunk files it names, mirrored (``b-<build>/chunk-00000.mdb``). Every process
reading the copy holds a shared ``flock`` (see pins.py; the kernel drops it when a process dies,
even by SIGKILL) on ``<root>/<id>/+pin.<version>``, whose mtime records the last use for
least-recently-used eviction, and on ``b-<build>/+pin`` of each build it reads: a copy is evicted
only when nobody reads it, and a build the manifest no longer names once nobody reads that build.

A version read on demand (storage/ondemand.py) is a copy with only some chunks present. Its
readers hold ``<root>/<id>/+demand.<version>`` instead of the copy's pin (the copy is not
evicted as a whole while read, but its chunks may be), and each chunk they have open by a pin
beside it (``chunk-00000.mdb.pin``, its mtime the chunk's last use), each chunk fetched ahead
of a reader by a softer one (``chunk-00000.mdb.ahead``: fetches ahead never evict it, a
reader that finds no other room does);
``chunk-00000.mdb.lock`` makes one process fetch a chunk while the others wait, and the
fetch writes into ``chunk-00000.mdb.fetching``, made at its full size first. Making room
(``room``, under ``<root>/+space.lock``, so that the processes of a machine count together)
evicts least-recently-used first: whole copies nobody reads, then single chunks nobody pins of
copies nobody reads whole, so that the cache never grows over its limit while what is in use
fits in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence

from filelock import FileLock, Timeout

from yogadl_plus import lifecycle
from yogadl_plus.cache.integrity import STAMP_SUFFIX, stamp
from yogadl_plus.cache.manifest import MANIFEST_NAME, ChunkInfo, Manifest
from yogadl_plus.checks import check_int
from yogadl_plus.errors import CacheLimitWarning, NoRoom, PinGone, StorageError, unwritable
from yogadl_plus.files import write_durably
from yogadl_plus.storage.local import LocalStorage, build_pin_path
from yogadl_plus.storage.pins import Pin, Pins, exclusively

__all__ = ["AHEAD_PIN", "CHUNK_PIN", "FETCHING", "SMALL_FILES", "LocalCache", "NoRoom"]

_PIN = "+pin."
_DEMAND = "+demand."
_PART = ".part"
_SPACE_LOCK = "+lock.space"
CHUNK_PIN = ".pin"
AHEAD_PIN = ".ahead"
CHUNK_LOCK = ".lock"
FETCHING = ".fetching"
# Reserved with each chunk for the small files written beside it (its stamp, pins).
SMALL_FILES = 4096
# How long making room may wait for another process making room (it holds the lock briefly).
_SPACE_WAIT_S = 60.0
_PIN_ATTEMPTS = 200
# How long a reader that needs room waits for fetches to end and other processes to let go.
_ROOM_WAIT_S = 5.0
# How often a waiter for a lock held briefly (space) or by a fetch (a chunk) tries it again.
_POLL_S = 0.002


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
            # A reader on demand may have fetched it meanwhile (and may have it open): keep it.
            with self.space():
                if _place(part, final):
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
        with self.room(need, keep):
            pass

    @contextlib.contextmanager
    def room(
        self, need: int, keep: tuple[str, str], strict: bool = False, reserve: int = 0
    ) -> Iterator[None]:
        """Evict what nobody uses, least recently used first, until ``need`` more bytes fit
        the limit, then hold the machine's space lock for the block, in which the caller
        takes the room (makes its file). If what is left is in use: a CacheLimitWarning, or
        with ``strict`` NoRoom. ``keep``: the copy (dataset_id, version) being filled, which
        is not evicted whole. ``reserve``: bytes a strict caller leaves free besides (for a
        reader's next chunk: fetches ahead never take the room readers need). When what is
        left will go soon (chunks being fetched, then evictable; chunks other processes pin,
        which they let go as they read on), it waits for up to _ROOM_WAIT_S first."""
        deadline = time.monotonic() + _ROOM_WAIT_S
        while True:
            with self.space():
                short, soon = self._evict_until(need + (reserve if strict else 0), keep, strict)
                if not short or strict or not soon or time.monotonic() > deadline:
                    if short:
                        self._over(short, need, strict)
                    yield
                    return
            time.sleep(_POLL_S * 5)  # (without the space lock: they may need it to go on)

    @contextlib.contextmanager
    def space(self) -> Iterator[None]:
        """The machine's lock on the cache's size: held while the cache is measured and room
        made, and while a file of counted size is renamed (a listing can miss a file renamed
        while it runs). Without a limit there is nothing to count: no lock."""
        if self.limit is None:
            yield
            return
        lock = FileLock(os.path.join(self.root, _SPACE_LOCK), thread_local=False)
        try:
            lock.acquire(timeout=_SPACE_WAIT_S, poll_interval=_POLL_S)
        except Timeout:
            raise StorageError(
                f"{lock.lock_file}: another process has held the local cache's space lock for "
                f"{_SPACE_WAIT_S:.0f} s (is it stopped?); try again, or end that process"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def _evict_until(self, need: int, keep: tuple[str, str], strict: bool) -> tuple[int, bool]:
        """Evict until ``need`` more bytes fit: (bytes still short, whether some of what could
        not be evicted will be soon: a chunk being fetched, or pinned by another process
        only, which lets go as it reads on)."""
        self.local.remove_discarded()
        if self.limit is None:
            return 0, False
        usage, candidates = self._survey()
        if usage + need <= self.limit:
            return 0, False
        gone: set[tuple[str, str]] = set()
        chunk_bytes: dict[tuple[str, str], int] = {}
        soon = False
        order = sorted(candidates, key=lambda c: (c.used, c.rank))
        # A reader in need may take what was fetched ahead for others; a fetch ahead may not.
        # (Of chunks fetched ahead, those fetched last are needed last: they go first.)
        ahead = sorted((c for c in order if c.rank == _CHUNK), key=lambda c: -c.used)
        passes = [order] if strict else [order, ahead]
        for spare_ahead, items in zip((True, False), passes):
            last = items is passes[-1]
            for item in items:
                if usage + need <= self.limit:
                    return 0, False
                copy = (item.dataset_id, item.version)
                if copy in gone or (item.rank == _COPY and copy == keep):
                    continue
                freed = self._evict_item(item, spare_ahead)
                if freed is None:
                    if item.rank == _LEFTOVER or (
                        last and item.rank == _CHUNK and not _pinned_here(item.path + CHUNK_PIN)
                    ):
                        soon = True
                    continue
                if item.rank == _COPY:
                    gone.add(copy)
                    freed -= chunk_bytes.get(copy, 0)
                else:
                    chunk_bytes[copy] = chunk_bytes.get(copy, 0) + freed
                usage -= freed
        return max(usage + need - self.limit, 0), soon

    def _over(self, short: int, need: int, strict: bool) -> None:
        """What is left is in use: NoRoom for a strict caller, else go over, saying so."""
        if strict:
            raise NoRoom(f"{self.root}: no room for {need:,} more bytes")
        assert self.limit is not None
        warnings.warn(
            f"the local cache {self.root} needs {self.limit + short:,} bytes, over its limit "
            f"of {self.limit:,}: what it holds is in use by live processes (versions they "
            "read, chunks they have open) or being pulled now",
            CacheLimitWarning,
            stacklevel=5,
        )

    def _survey(self) -> tuple[int, list[_Evictable]]:
        """(bytes of every file under the root, what could be evicted), in one walk."""
        stats = dict(_walk(self.root))
        usage = sum(st.st_size for st in stats.values())
        copies: dict[tuple[str, str], list[str]] = {}
        for path in stats:
            parts = os.path.relpath(path, self.root).split(os.sep)
            if len(parts) > 2 and "+" not in parts[0] and "+" not in parts[1]:
                copies.setdefault((parts[0], parts[1]), []).append(path)

        def used(path: str) -> float:
            st = stats.get(path)
            return st.st_mtime if st is not None else 0.0

        found: list[_Evictable] = []
        for (dataset_id, version), paths in copies.items():
            copy_used = max(
                used(self._pin_path(dataset_id, version)),
                used(self._demand_pin_path(dataset_id, version)),
            )
            newest, size = copy_used, 0
            for path in paths:
                nbytes = stats[path].st_size
                size += nbytes
                if path.endswith(FETCHING):
                    found.append(_Evictable(_LEFTOVER, dataset_id, version, path, nbytes, -1))
                elif path.endswith(".mdb"):
                    last = max(used(path + CHUNK_PIN), used(path + AHEAD_PIN)) or copy_used
                    newest = max(newest, last)
                    stamp_st = stats.get(path + STAMP_SUFFIX)
                    nbytes += stamp_st.st_size if stamp_st is not None else 0
                    found.append(_Evictable(_CHUNK, dataset_id, version, path, nbytes, last))
            folder = os.path.join(self.root, dataset_id, version)
            found.append(_Evictable(_COPY, dataset_id, version, folder, size, newest))
        return usage, found

    def _evict_item(self, item: _Evictable, spare_ahead: bool) -> int | None:
        """Remove one copy, chunk or leftover if nobody uses it: the bytes freed, or None.
        ``spare_ahead``: a chunk fetched ahead for a reader counts as used."""
        if item.rank == _COPY:
            return item.size if self._evict(item.dataset_id, item.version) else None
        if item.rank == _LEFTOVER:
            # A fetch killed midway, unless its fetcher still holds the chunk's lock.
            lock = FileLock(item.path[: -len(FETCHING)] + CHUNK_LOCK, thread_local=False)
        else:
            lock = FileLock(self._lock_path(item.dataset_id, item.version), thread_local=False)
        try:
            lock.acquire(timeout=0)
        except (Timeout, OSError):
            return None
        try:
            if item.rank == _LEFTOVER:
                return item.size if _remove(item.path) else 0
            # A chunk goes only if nobody reads the copy whole and nobody pins the chunk.
            with exclusively(self._pin_path(item.dataset_id, item.version)) as free:
                if not free:
                    return None
                with (
                    exclusively(item.path + CHUNK_PIN) as chunk_free,
                    exclusively(item.path + AHEAD_PIN) if spare_ahead else _free() as ahead_free,
                ):
                    if not (chunk_free and ahead_free):
                        return None
                    _remove(item.path + STAMP_SUFFIX)
                    return item.size if _remove(item.path) else 0
        finally:
            lock.release()

    def _evict(self, dataset_id: str, version: str) -> bool:
        """Remove one copy if no process is pulling or reading it; whether it was removed."""
        lock = FileLock(self._lock_path(dataset_id, version), thread_local=False)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        try:
            with (
                exclusively(self._pin_path(dataset_id, version)) as free,
                exclusively(self._demand_pin_path(dataset_id, version)) as demand_free,
            ):
                if free and demand_free:
                    self.local.discard(dataset_id, version)
                return free and demand_free
        finally:
            lock.release()

    # --- reading on demand ---

    def _demand_pin_path(self, dataset_id: str, version: str) -> str:
        return os.path.join(self.root, dataset_id, _DEMAND + version)

    def open_on_demand(
        self, dataset_id: str, version: str, manifest_bytes: bytes, manifest: Manifest
    ) -> tuple[str, Pins]:
        """The local copy of ``manifest_bytes`` with the chunks it holds (none pulled now),
        pinned for reading on demand: not evicted as a whole while pinned, though chunks
        nobody pins may be (see ``pin_chunk``)."""
        folder = self.path(dataset_id, version)
        if _read_bytes(os.path.join(folder, MANIFEST_NAME)) == manifest_bytes:
            with contextlib.suppress(PinGone):
                pins = self._demand_pins(dataset_id, version, manifest)
                if _read_bytes(os.path.join(folder, MANIFEST_NAME)) == manifest_bytes:
                    return folder, pins
                pins.release()
        keep = (dataset_id, version)
        with (
            self.local.lock(dataset_id, version),
            self.room(len(manifest_bytes) + SMALL_FILES, keep),
        ):
            self._update(dataset_id, version, manifest_bytes, manifest, (), _nothing)
            for build in _builds(manifest):  # (where its chunks and their pins will be)
                os.makedirs(os.path.join(folder, build), exist_ok=True)
            return folder, self._demand_pins(dataset_id, version, manifest)

    def _demand_pins(self, dataset_id: str, version: str, manifest: Manifest) -> Pins:
        folder = self.path(dataset_id, version)
        pins = [Pin(self._demand_pin_path(dataset_id, version), touch=True)]
        try:
            pins.extend(Pin(build_pin_path(folder, b)) for b in _builds(manifest))
        except PinGone:
            Pins(pins).release()
            raise
        return Pins(pins)

    def pin_chunk(self, path: str, ahead: bool = False) -> Pin:
        """A pin on the chunk file ``path`` of a copy read on demand (present or not): it is
        not evicted while the pin is held. Its time of last use is now. ``ahead``: a softer
        pin, for a chunk fetched ahead of its reader (see the module's docstring)."""
        for _ in range(_PIN_ATTEMPTS):
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                if ahead:
                    return Pin(path + AHEAD_PIN, touch=True)
                return _ChunkPin(path + CHUNK_PIN)
            except PinGone:
                time.sleep(0.005)  # being evicted this instant: then it is not there
            except OSError as exc:
                raise unwritable(path + CHUNK_PIN, exc) from None
        raise StorageError(f"{path}: could not pin this chunk (it kept being evicted); try again")

    @staticmethod
    def opened_since_ahead(path: str) -> bool:
        """Whether a reader (of any process) pinned the chunk file ``path`` since it was last
        pinned as fetched ahead: then whoever fetched it ahead can let go of it."""
        return _mtime(path + CHUNK_PIN) > _mtime(path + AHEAD_PIN) > 0

    @contextlib.contextmanager
    def fetching(self, path: str, timeout: float) -> Iterator[None]:
        """Held by the one thread of this machine fetching the chunk file ``path``; the others
        wait for it (at most ``timeout`` seconds, then a StorageError)."""
        lock = FileLock(path + CHUNK_LOCK, thread_local=False)
        try:
            lock.acquire(timeout=timeout, poll_interval=_POLL_S)
        except Timeout:
            raise StorageError(
                f"{path}: another process or thread has been fetching this chunk for "
                f"{timeout:.0f} s (it holds {lock.lock_file}); is it stopped? try again"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def remove(self, dataset_id: str, version: str) -> None:
        """Drop the local copy if there is one (readers with open files keep reading them)."""
        with self.local.lock(dataset_id, version):
            if os.path.isdir(self.path(dataset_id, version)):
                self.local.discard(dataset_id, version)


# The chunk pins this process holds, by path: room() waits for other processes' pins only.
_PINNED: dict[str, int] = {}
_PINNED_LOCK = threading.Lock()


class _ChunkPin(Pin):
    """A reader's pin on a chunk, counted in _PINNED while held."""

    def __init__(self, path: str) -> None:
        self._counted = False
        super().__init__(path, touch=True)
        if self.held:
            with _PINNED_LOCK:
                _PINNED[path] = _PINNED.get(path, 0) + 1
            self._counted = True

    def release(self) -> None:
        if getattr(self, "_counted", False):
            self._counted = False
            with _PINNED_LOCK:
                left = _PINNED.get(self.path, 0) - 1
                if left > 0:
                    _PINNED[self.path] = left
                else:
                    _PINNED.pop(self.path, None)
        super().release()


def _pinned_here(path: str) -> bool:
    return _PINNED.get(path, 0) > 0


def _new_lock_after_fork() -> None:
    global _PINNED_LOCK
    _PINNED_LOCK = threading.Lock()  # a thread of the parent may have held it


lifecycle.on_fork(after_in_child=_new_lock_after_fork)


_LEFTOVER, _COPY, _CHUNK = 0, 1, 2  # at equal times of last use, evicted in this order


@dataclasses.dataclass(frozen=True)
class _Evictable:
    """A copy, a chunk of one, or a leftover of a killed fetch, as the eviction sees it."""

    rank: int  # _LEFTOVER, _COPY or _CHUNK
    dataset_id: str
    version: str
    path: str
    size: int
    used: float


@contextlib.contextmanager
def _free() -> Iterator[bool]:
    yield True


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


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def _file_bytes(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _remove(path: str) -> bool:
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True


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


def _walk(folder: str) -> Iterator[tuple[str, os.stat_result]]:
    """(path, lstat) of every file under ``folder``; what vanishes meanwhile is left out."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(entry.path)
            else:
                yield entry.path, entry.stat(follow_symlinks=False)
        except OSError:
            continue


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
