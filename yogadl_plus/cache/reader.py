"""Reads record values out of a version's chunk files: one long read transaction per chunk per
thread per process, reopened after fork."""

from __future__ import annotations

import os
import threading
import weakref
from typing import cast

import lmdb
import numpy as np

from yogadl_plus.cache.manifest import ChunkInfo, Manifest
from yogadl_plus.errors import CacheCorrupted

__all__ = ["ChunkSet"]

_OPEN_SETS: weakref.WeakSet[ChunkSet] = weakref.WeakSet()


def _forget_handles_after_fork() -> None:
    # LMDB handles must not be used in a child process: each child opens its own.
    for chunk_set in list(_OPEN_SETS):
        chunk_set._drop_handles()


os.register_at_fork(after_in_child=_forget_handles_after_fork)


class ChunkSet:
    """The chunk files of one version, read by global record index."""

    def __init__(self, directory: str, manifest: Manifest) -> None:
        self.directory = directory
        self.chunks: list[ChunkInfo] = list(manifest.chunks)
        self.starts = np.cumsum([0] + [c.records for c in self.chunks], dtype=np.int64)
        self.num_records = int(self.starts[-1])
        self._envs: list[lmdb.Environment | None] = [None] * len(self.chunks)
        self._local = threading.local()
        self._lock = threading.Lock()
        _OPEN_SETS.add(self)

    def _drop_handles(self) -> None:
        self._envs = [None] * len(self.chunks)
        self._local = threading.local()
        self._lock = threading.Lock()

    def close(self) -> None:
        txns = getattr(self._local, "txns", None) or []
        for txn in txns:
            if txn is not None:
                txn.abort()
        for env in self._envs:
            if env is not None:
                env.close()
        self._drop_handles()

    def _env(self, number: int) -> lmdb.Environment:
        env = self._envs[number]
        if env is None:
            with self._lock:
                env = self._envs[number]
                if env is None:
                    env = self._envs[number] = self._open(number)
        return env

    def _open(self, number: int) -> lmdb.Environment:
        info = self.chunks[number]
        path = os.path.join(self.directory, info.file)
        try:
            size = os.path.getsize(path)
        except OSError as exc:
            raise CacheCorrupted(f"chunk {path} is missing ({exc.strerror})") from None
        if size != info.bytes:
            raise CacheCorrupted(
                f"chunk {path} has {size} bytes, the manifest says {info.bytes}; "
                "the version is damaged: delete it and build it again"
            )
        try:
            env = lmdb.open(
                path, subdir=False, readonly=True, lock=False, readahead=False, max_dbs=0
            )
        except lmdb.Error as exc:
            raise CacheCorrupted(f"chunk {path} is not a readable LMDB file: {exc}") from None
        entries = env.stat()["entries"]
        if entries != info.records:
            env.close()
            raise CacheCorrupted(
                f"chunk {path} holds {entries} records, the manifest says {info.records}"
            )
        return env

    def txn(self, number: int) -> lmdb.Transaction:
        """This thread's long-lived read transaction on chunk ``number``."""
        txns = getattr(self._local, "txns", None)
        if txns is None:
            txns = self._local.txns = [None] * len(self.chunks)
        txn = txns[number]
        if txn is None:
            txn = txns[number] = self._env(number).begin(buffers=True)
        return txn

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(chunk number, index inside that chunk) of each global record index."""
        chunk = np.searchsorted(self.starts, indices, side="right") - 1
        return chunk, indices - self.starts[chunk]

    def get(self, index: int) -> memoryview:
        """The value of one record; valid until this thread's transaction ends."""
        if len(self.chunks) == 1:
            number, local = 0, index
        else:
            number = int(np.searchsorted(self.starts, index, side="right")) - 1
            local = index - int(self.starts[number])
        value = self.txn(number).get(local.to_bytes(4, "big"))
        if value is None:
            raise CacheCorrupted(f"record {index} is missing from {self.chunks[number].file}")
        return cast(memoryview, value)

    def get_many(self, indices: np.ndarray) -> list[memoryview]:
        """The values of many records, in the order given."""
        if len(self.chunks) == 1:
            get = self.txn(0).get
            keys = np.asarray(indices, dtype=">u4").tobytes()
            values = [get(keys[j : j + 4]) for j in range(0, len(keys), 4)]
        else:
            chunk, local = self.locate(np.asarray(indices, dtype=np.int64))
            keys = local.astype(">u4").tobytes()
            gets = [self.txn(n).get for n in range(len(self.chunks))]
            values = [gets[c](keys[4 * j : 4 * j + 4]) for j, c in enumerate(chunk.tolist())]
        if None in values:
            missing = [int(indices[j]) for j, v in enumerate(values) if v is None]
            raise CacheCorrupted(f"records {missing[:10]} are missing from the chunk files")
        return cast(list[memoryview], values)

    def verify(self) -> None:
        """Re-hash every chunk file against the manifest; CacheCorrupted names the first bad one."""
        from yogadl_plus.cache.manifest import file_sha256

        for info in self.chunks:
            path = os.path.join(self.directory, info.file)
            if not os.path.exists(path):
                raise CacheCorrupted(f"chunk {path} is missing")
            size = os.path.getsize(path)
            if size != info.bytes:
                raise CacheCorrupted(
                    f"chunk {path} has {size} bytes, the manifest says {info.bytes}"
                )
            digest = file_sha256(path)
            if digest != info.sha256:
                raise CacheCorrupted(
                    f"chunk {path} has sha256 {digest}, the manifest says {info.sha256}; "
                    "the version is damaged: delete it and build it again"
                )

    def __len__(self) -> int:
        return self.num_records
