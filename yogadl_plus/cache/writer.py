"""Writes encoded records into LMDB chunk files, rolling over to a new chunk by size."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from types import TracebackType

import lmdb
import numpy as np

from yogadl_plus.cache.manifest import ChunkInfo, file_sha256
from yogadl_plus.errors import CacheCorrupted

__all__ = ["DEFAULT_CHUNK_BYTES", "ChunkWriter", "chunk_file_name", "column_key", "record_key"]

DEFAULT_CHUNK_BYTES = 256 << 20
_COMMIT_BYTES = 64 << 20
_COMMIT_RECORDS = 50_000
_MAX_CHUNK_RECORDS = 2**32 - 1


def chunk_file_name(number: int, prefix: str = "") -> str:
    return f"{prefix}chunk-{number:05d}.mdb"


def record_key(local_index: int) -> bytes:
    """The LMDB key of a record inside its chunk: big-endian, so keys sort in record order."""
    return local_index.to_bytes(4, "big")


def column_key(name: str) -> bytes:
    """The LMDB key of a whole-chunk column array: longer than a record key and starting with
    the largest one, so it sorts after every record (appends stay in key order)."""
    return b"\xff\xff\xff\xff" + name.encode("utf-8")


class ChunkWriter:
    """Appends record values to ``chunk-NNNNN.mdb`` files in ``directory``.

    Puts are buffered and written in large transactions with MDB_APPEND. If the memory map is
    too small, the transaction is aborted, the map grown, and the same buffered puts written
    again, so nothing is lost. ``prefix`` starts every file name: tasks of a parallel build
    write into one folder without clashing. ``on_close`` is called with each chunk as soon as
    it is complete (a build task hands it on while writing the next).
    """

    def __init__(
        self,
        directory: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        prefix: str = "",
        on_close: Callable[[ChunkInfo], object] | None = None,
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        self.directory = directory
        self.chunk_bytes = chunk_bytes
        self.prefix = prefix
        self.on_close = on_close
        self.chunks: list[ChunkInfo] = []
        self._env: lmdb.Environment | None = None
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._chunk_records = 0
        self._chunk_bytes = 0
        self._map_size = 0
        self._columns: dict[str, list[np.ndarray]] = {}

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    @property
    def num_records(self) -> int:
        return sum(c.records for c in self.chunks) + self._chunk_records

    def add_many(
        self, values: list[bytes], columns: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """Append records in order. ``columns`` are per-record arrays of some fields (one
        element per value) that each chunk also stores whole, under its column key."""
        start = 0
        while start < len(values):
            if self._env is None:
                self._open_chunk()
            # Fill the current chunk up to its size limit, then roll over.
            room = self.chunk_bytes - self._chunk_bytes
            stop = start
            taken = 0
            while stop < len(values) and taken < room:
                taken += len(values[stop]) + 4
                stop += 1
            first = self._chunk_records
            keys = [record_key(first + j) for j in range(stop - start)]
            self._pending.extend(zip(keys, values[start:stop]))
            for name, column in (columns or {}).items():
                self._columns.setdefault(name, []).append(column[start:stop])
            self._chunk_records += stop - start
            self._chunk_bytes += taken
            self._pending_bytes += taken
            if self._pending_bytes >= _COMMIT_BYTES or len(self._pending) >= _COMMIT_RECORDS:
                self._commit()
            if self._chunk_bytes >= self.chunk_bytes or self._chunk_records >= _MAX_CHUNK_RECORDS:
                self._close_chunk()
            start = stop

    def close(self) -> list[ChunkInfo]:
        """Finish the last chunk; returns every chunk written, each checked and hashed."""
        if self._env is not None:
            self._close_chunk()
        return self.chunks

    def abort(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
        self._pending.clear()

    def _path(self, number: int) -> str:
        return os.path.join(self.directory, chunk_file_name(number, self.prefix))

    def _open_chunk(self) -> None:
        self._map_size = max(2 * self.chunk_bytes, 64 << 20)
        self._env = lmdb.open(
            self._path(len(self.chunks)),
            subdir=False,
            map_size=self._map_size,
            lock=False,
            sync=False,
            metasync=False,
            meminit=False,
            max_dbs=0,
        )
        self._chunk_records = 0
        self._chunk_bytes = 0

    def _commit(self) -> None:
        assert self._env is not None
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    txn.cursor().putmulti(self._pending, append=True)
                break
            except lmdb.MapFullError:
                # The aborted transaction dropped its puts; they are still in self._pending.
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)
        self._pending = []
        self._pending_bytes = 0

    def _close_chunk(self) -> None:
        assert self._env is not None
        names = sorted(self._columns)  # column keys sort after every record key, by name
        for name in names:
            data = np.concatenate(self._columns[name]).tobytes()
            self._pending.append((column_key(name), data))
            self._pending_bytes += len(data)
        self._columns = {}
        self._commit()
        self._env.sync(True)
        entries = self._env.stat()["entries"]
        self._env.close()
        self._env = None
        path = self._path(len(self.chunks))
        if entries != self._chunk_records + len(names):
            raise CacheCorrupted(
                f"{path}: wrote {self._chunk_records} records and {len(names)} columns but the "
                f"chunk holds {entries} entries"
            )
        self.chunks.append(
            ChunkInfo(
                file=os.path.basename(path),
                records=self._chunk_records,
                bytes=os.path.getsize(path),
                sha256=file_sha256(path),
                columns=tuple(names),
            )
        )
        self._chunk_records = 0
        self._chunk_bytes = 0
        if self.on_close is not None:
            self.on_close(self.chunks[-1])
