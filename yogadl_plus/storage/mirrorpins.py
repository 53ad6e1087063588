"""The pins of a local cache: which pin file keeps what on disk, taking them, and which chunk
pins this process holds itself (file names: mirrorfiles.py; how a pin works: pins.py)."""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

from yogadl_plus import lifecycle
from yogadl_plus.cache.manifest import Manifest
from yogadl_plus.deprecation import old_names
from yogadl_plus.errors import PinGone, StorageError, unwritable
from yogadl_plus.storage.local import build_pin_path, builds_named
from yogadl_plus.storage.mirrorfiles import (
    AHEAD_PIN,
    CHUNK_PIN,
    copy_pin_path,
    demand_pin_path,
)
from yogadl_plus.storage.pins import Pin, Pins

__all__ = ["MirrorPins", "builds"]

if not TYPE_CHECKING:  # its names of the last release, with a DeprecationWarning
    __getattr__ = old_names(__name__)

_PIN_ATTEMPTS = 200


class MirrorPins:
    """The pins of the local cache under ``root``."""

    def __init__(self, root: str) -> None:
        self.root = root

    def copy(self, dataset_id: str, version: str) -> str:
        """The pin file of the whole copy of (dataset_id, version)."""
        return copy_pin_path(self.root, dataset_id, version)

    def demand(self, dataset_id: str, version: str) -> str:
        """The pin file of the readers of (dataset_id, version) on demand."""
        return demand_pin_path(self.root, dataset_id, version)

    def readers(
        self, dataset_id: str, version: str, manifest: Manifest, on_demand: bool = False
    ) -> Pins:
        """What a reader of the copy of (dataset_id, version) holds: the copy's pin (the pin
        of readers on demand, ``on_demand``), so that the copy is not evicted as a whole while
        it is held (its time is the copy's last use), and one on each build it reads (an old
        build goes once none of its readers is left, while readers of the new one read on)."""
        version_pin = self.demand if on_demand else self.copy
        folder = os.path.join(self.root, dataset_id, version)
        pins = [Pin(version_pin(dataset_id, version), touch=True)]
        try:
            pins.extend(Pin(build_pin_path(folder, b)) for b in builds(manifest))
        except PinGone:
            Pins(pins).release()
            raise
        return Pins(pins)

    def chunk(self, path: str, ahead: bool = False) -> Pin:
        """A pin on the chunk file ``path`` of a copy read on demand (present or not): it is
        not evicted while the pin is held. Its time of last use is now. ``ahead``: a softer
        pin, for a chunk fetched ahead of its reader (see mirrorfiles.py)."""
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
    def held_here(chunk_pin: str) -> bool:
        """Whether this process holds the chunk pin file ``chunk_pin`` (the room a reader
        waits for is what other processes pin: they let go as they read on)."""
        return _HELD_HERE.holds(chunk_pin)

    @staticmethod
    def opened_since_ahead(path: str) -> bool:
        """Whether a reader (of any process) pinned the chunk file ``path`` since it was last
        pinned as fetched ahead: then whoever fetched it ahead can let go of it."""
        return _mtime(path + CHUNK_PIN) > _mtime(path + AHEAD_PIN) > 0


def builds(manifest: Manifest) -> list[str]:
    """The build folders a remote manifest's chunks live in."""
    return sorted(b for b in builds_named(manifest) if b)


class _HeldCount:
    """The chunk pins this process holds, by path: one count per process, whatever the number
    of Mirror objects on one root."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def add(self, path: str) -> None:
        with self.lock:
            self.counts[path] = self.counts.get(path, 0) + 1

    def remove(self, path: str) -> None:
        with self.lock:
            left = self.counts.get(path, 0) - 1
            if left > 0:
                self.counts[path] = left
            else:
                self.counts.pop(path, None)

    def holds(self, path: str) -> bool:
        return self.counts.get(path, 0) > 0

    def new_lock(self) -> None:
        self.lock = threading.Lock()  # a thread of the parent may have held it


_HELD_HERE = _HeldCount()
lifecycle.on_fork(after_in_child=_HELD_HERE.new_lock)


class _ChunkPin(Pin):
    """A reader's pin on a chunk, counted in _HELD_HERE while held."""

    def __init__(self, path: str) -> None:
        self._counted = False
        super().__init__(path, touch=True)
        if self.held:
            _HELD_HERE.add(path)
            self._counted = True

    def release(self) -> None:
        if getattr(self, "_counted", False):
            self._counted = False
            _HELD_HERE.remove(self.path)
        super().release()


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0
