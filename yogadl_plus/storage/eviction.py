"""Keeping a machine's local cache under its size limit: measure it, evict what nobody uses
(least recently used first), and hold the machine's space lock while room is taken.

Whole copies nobody reads go first, then single chunks nobody pins of copies nobody reads
whole, then leftovers of fetches that were killed, so that the cache never grows over its limit
while what is in use fits in it. Pins and their files: mirrorpins.py, mirrorfiles.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from yogadl_plus.cache.integrity import STAMP_SUFFIX
from yogadl_plus.deprecation import old_names
from yogadl_plus.errors import CacheLimitWarning, NoRoom
from yogadl_plus.storage.local import LocalStorage
from yogadl_plus.storage.mirrorfiles import (
    AHEAD_PIN,
    CHUNK_LOCK,
    CHUNK_PIN,
    FETCHING,
    POLL_S,
    SPACE_LOCK,
    holding,
    holds_chunk_bytes,
)
from yogadl_plus.storage.mirrorpins import MirrorPins
from yogadl_plus.storage.pins import exclusively

__all__ = ["MirrorSpace"]

if not TYPE_CHECKING:  # its names of the last release, with a DeprecationWarning
    __getattr__ = old_names(__name__)

log = logging.getLogger(__name__)

# How long making room may wait for another process making room (it holds the lock briefly).
_SPACE_WAIT_S = 60.0
# How long a reader that needs room waits for fetches to end and other processes to let go.
_ROOM_WAIT_S = 5.0
# The local caches (by root) that warned they went over their limit, in this process: once
# each, since the numbers in the message change with every fetch and so would pass the
# warnings module's own once-per-place filter every time. Later times go to the log.
_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


class MirrorSpace:
    """The size of the local cache ``local`` (its pins: ``pins``), kept at most ``limit``
    bytes (None: no limit, nothing to count)."""

    def __init__(self, local: LocalStorage, pins: MirrorPins, limit: int | None) -> None:
        self.local = local
        self.root = local.root
        self.pins = pins
        self.limit = limit

    def make_room(self, need: int, keep: tuple[str, str]) -> None:
        """``room`` for a caller that takes it later, under locks of its own."""
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
            with self.lock():
                short, soon = self._evict_until(need + (reserve if strict else 0), keep, strict)
                if not short or strict or not soon or time.monotonic() > deadline:
                    if short:
                        self._over(short, need, strict)
                    yield
                    return
            time.sleep(POLL_S * 5)  # (without the space lock: they may need it to go on)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """The machine's lock on the cache's size: held while the cache is measured and room
        made, and while a file of counted size is renamed (a listing can miss a file renamed
        while it runs). Without a limit there is nothing to count: no lock."""
        if self.limit is None:
            yield
            return
        lock_file = os.path.join(self.root, SPACE_LOCK)
        stuck = (
            f"{lock_file}: another process has held the local cache's space lock for "
            f"{_SPACE_WAIT_S:.0f} s (is it stopped?); try again, or end that process"
        )
        with holding(lock_file, _SPACE_WAIT_S, stuck):
            yield

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
                        last
                        and item.rank == _CHUNK
                        and not self.pins.held_here(item.path + CHUNK_PIN)
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
        message = (
            f"the local cache {self.root} needs {self.limit + short:,} bytes, over its limit "
            f"of {self.limit:,}: what it holds is in use by live processes (versions they "
            "read, chunks they have open) or being pulled now"
        )
        with _WARNED_LOCK:
            first = self.root not in _WARNED
            _WARNED.add(self.root)
        if not first:
            log.info("%s", message)
            return
        warnings.warn(
            f"{message} (said once for this cache; later times at INFO in the log)",
            CacheLimitWarning,
            stacklevel=5,
        )

    def _survey(self) -> tuple[int, list[_Evictable]]:
        """(bytes of chunks under the root, what could be evicted), in one walk. (The limit
        counts chunk bytes only: mirrorfiles.py.)"""
        stats = dict(_walk(self.root))
        chunks = [path for path in stats if holds_chunk_bytes(os.path.basename(path))]
        usage = sum(stats[path].st_size for path in chunks)
        copies: dict[tuple[str, str], list[str]] = {}
        for path in chunks:
            parts = os.path.relpath(path, self.root).split(os.sep)
            if len(parts) > 2 and "+" not in parts[0] and "+" not in parts[1]:
                copies.setdefault((parts[0], parts[1]), []).append(path)

        def used(path: str) -> float:
            st = stats.get(path)
            return st.st_mtime if st is not None else 0.0

        found: list[_Evictable] = []
        for (dataset_id, version), paths in copies.items():
            copy_used = max(
                used(self.pins.copy(dataset_id, version)),
                used(self.pins.demand(dataset_id, version)),
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
                    found.append(_Evictable(_CHUNK, dataset_id, version, path, nbytes, last))
            folder = os.path.join(self.root, dataset_id, version)
            found.append(_Evictable(_COPY, dataset_id, version, folder, size, newest))
        return usage, found

    def _evict_item(self, item: _Evictable, spare_ahead: bool) -> int | None:
        """Remove one copy, chunk or leftover if nobody uses it: the bytes freed, or None.
        ``spare_ahead``: a chunk fetched ahead for a reader counts as used."""
        if item.rank == _COPY:
            if not self.evict_copy(item.dataset_id, item.version):
                return None
            log.info(
                "evicted %s:%s from the local cache %s: %s bytes",
                item.dataset_id,
                item.version,
                self.root,
                f"{item.size:,}",
            )
            return item.size
        if item.rank == _LEFTOVER:
            # A fetch killed midway, unless its fetcher still holds the chunk's lock.
            lock = FileLock(item.path[: -len(FETCHING)] + CHUNK_LOCK, thread_local=False)
            try:
                lock.acquire(timeout=0)
            except (Timeout, OSError):
                return None
            try:
                return item.size if _remove(item.path) else 0
            finally:
                lock.release()
        try:
            with self.local.version_lock(item.dataset_id, item.version, wait=False) as held:
                return self._evict_chunk(item, spare_ahead) if held else None
        except OSError:
            return None

    def _evict_chunk(self, item: _Evictable, spare_ahead: bool) -> int | None:
        """Under its version's lock: remove a chunk nobody pins; the bytes freed, or None."""
        # A chunk goes only if nobody reads the copy whole and nobody pins the chunk.
        with exclusively(self.pins.copy(item.dataset_id, item.version)) as free:
            if not free:
                return None
            with (
                exclusively(item.path + CHUNK_PIN) as chunk_free,
                exclusively(item.path + AHEAD_PIN) if spare_ahead else _free() as ahead_free,
            ):
                if not (chunk_free and ahead_free):
                    return None
                _remove(item.path + STAMP_SUFFIX)
                if not _remove(item.path):
                    return 0
                log.debug("evicted chunk %s (%s bytes)", item.path, f"{item.size:,}")
                return item.size

    def evict_copy(self, dataset_id: str, version: str) -> bool:
        """Remove one copy if no process is pulling or reading it; whether it was removed."""
        with self.local.version_lock(dataset_id, version, wait=False) as held:
            if not held:
                return False
            with (
                exclusively(self.pins.copy(dataset_id, version)) as free,
                exclusively(self.pins.demand(dataset_id, version)) as demand_free,
            ):
                if free and demand_free:
                    self.local.discard(dataset_id, version)
                return free and demand_free


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


def _remove(path: str) -> bool:
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True
