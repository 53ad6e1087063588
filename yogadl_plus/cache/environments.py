"""One LMDB environment per chunk file per process, shared by every ChunkSet that reads the file.

LMDB must not open one file twice in a process (py-lmdb refuses it), and two DataRefs of one
version are common, so environments are shared and counted by the file's identity (device and
inode). A forked child forgets the parent's: LMDB handles must not be used in a child process,
each child opens its own.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import lmdb

from yogadl_plus import lifecycle

__all__ = ["ENVIRONMENTS", "FileKey", "SharedEnvironments"]

FileKey = tuple[int, int]  # (device, inode) of a chunk file


class SharedEnvironments:
    """The process's table of open chunk environments, each with the number of its users.

    A set freed by the garbage collector never waits for the lock (the collector can run inside
    ``acquire``, on the thread holding it): its release is queued when the lock is busy.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[FileKey, list[Any]] = {}  # key -> [env, users]
        self.collected: list[FileKey] = []

    def acquire(self, path: str) -> tuple[FileKey, lmdb.Environment]:
        """The file's key and its environment, opened if no one in the process has it open."""
        st = os.stat(path)
        key = (st.st_dev, st.st_ino)
        with self.lock:
            self._release_collected()
            entry = self.entries.get(key)
            if entry is None:
                env = lmdb.open(
                    path, subdir=False, readonly=True, lock=False, readahead=False, max_dbs=0
                )
                entry = self.entries[key] = [env, 0]
            entry[1] += 1
            return key, entry[0]

    def release(self, keys: list[FileKey]) -> None:
        """One use less of each of ``keys`` (emptied); an environment nobody uses is closed."""
        with self.lock:
            self.collected.extend(keys)
            keys.clear()
            self._release_collected()

    def release_later(self, keys: list[FileKey]) -> None:
        """For finalizers: release now if the lock is free, else queue (never wait for it)."""
        self.collected.extend(keys)  # atomic under the GIL
        if self.lock.acquire(blocking=False):
            try:
                self._release_collected()
            finally:
                self.lock.release()

    def _release_collected(self) -> None:
        while self.collected:
            key = self.collected.pop()
            entry = self.entries.get(key)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] == 0:
                del self.entries[key]
                entry[0].close()

    def forget(self) -> None:
        """After fork: the parent's handles are not ours to use or close."""
        self.lock = threading.Lock()
        self.entries = {}
        self.collected = []


ENVIRONMENTS = SharedEnvironments()
# Forgotten before the chunk sets forget their own handles (they register later).
lifecycle.on_fork(after_in_child=ENVIRONMENTS.forget)
