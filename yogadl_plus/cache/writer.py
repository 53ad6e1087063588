"""Writes encoded records into LMDB chunk files, rolling over to a new chunk by size."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import lmdb
import numpy as np

from yogadl_plus.cache.integrity import stamp
from yogadl_plus.cache.keys import IDENTITY_KEY, KEY_BYTES, column_key, record_keys
from yogadl_plus.cache.manifest import MAX_CHUNK_RECORDS, ChunkInfo, new_chunk_id
from yogadl_plus.errors import CacheCorrupted, unwritable
from yogadl_plus.files import file_sha256

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "ChunkWriter",
    "chunk_file_name",
    "chunk_identity",
]

DEFAULT_CHUNK_BYTES = 256 << 20
_COMMIT_BYTES = 64 << 20
_COMMIT_RECORDS = 50_000


def chunk_file_name(number: int, prefix: str = "") -> str:
    return f"{prefix}chunk-{number:05d}.mdb"


def chunk_identity(info: ChunkInfo, schema: str) -> dict[str, Any]:
    """What a chunk says of itself under IDENTITY_KEY (JSON): the id, name (as written) and
    counts its manifest must give it, and the digest of the schema its records were encoded
    with."""
    return {
        "id": info.id,
        "file": os.path.basename(info.file),
        "records": info.records,
        "columns": list(info.columns),
        "schema": schema,
    }


class ChunkWriter:
    """Appends record values to ``chunk-NNNNN.mdb`` files in ``directory``.

    Puts are buffered and written in large transactions with MDB_APPEND. If the memory map is
    too small, the transaction is aborted, the map grown, and the same buffered puts written
    again, so nothing is lost. ``prefix`` starts every file name: tasks of a parallel build
    write into one folder without clashing. ``on_close`` is called with each chunk as soon as
    it is complete (a build task hands it on while writing the next). ``schema`` is the digest
    of the schema the values were encoded with; each chunk records it with its identity. A write
    that fails (a full disk) is a StorageError naming the chunk and the free space.
    """

    def __init__(
        self,
        directory: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        prefix: str = "",
        on_close: Callable[[ChunkInfo], object] | None = None,
        schema: str = "",
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        self.directory = directory
        self.chunk_bytes = chunk_bytes
        self.prefix = prefix
        self.on_close = on_close
        self.schema = schema
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
                taken += len(values[stop]) + KEY_BYTES
                stop += 1
            first = self._chunk_records
            keys = record_keys(np.arange(first, first + stop - start))
            self._pending.extend(zip(keys, values[start:stop]))
            for name, column in (columns or {}).items():
                self._columns.setdefault(name, []).append(column[start:stop])
            self._chunk_records += stop - start
            self._chunk_bytes += taken
            self._pending_bytes += taken
            if self._pending_bytes >= _COMMIT_BYTES or len(self._pending) >= _COMMIT_RECORDS:
                self._commit()
            if (
                self._chunk_bytes >= self.chunk_bytes
                or self._chunk_records >= MAX_CHUNK_RECORDS - 1
            ):
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
        path = self._path(len(self.chunks))
        try:
            self._env = lmdb.open(
                path,
                subdir=False,
                map_size=self._map_size,
                lock=False,
                sync=False,
                metasync=False,
                meminit=False,
                max_dbs=0,
            )
        except (lmdb.Error, OSError) as exc:
            raise unwritable(path, exc) from None
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
            except lmdb.Error as exc:  # a full disk shows as ENOSPC or EIO
                raise unwritable(self._path(len(self.chunks)), exc) from None
        self._pending = []
        self._pending_bytes = 0

    def _close_chunk(self) -> None:
        assert self._env is not None
        path = self._path(len(self.chunks))
        names = sorted(self._columns)  # column keys sort after the identity key, by name
        info = ChunkInfo(
            os.path.basename(path), self._chunk_records, 0, "", tuple(names), new_chunk_id()
        )
        identity = json.dumps(chunk_identity(info, self.schema)).encode()
        self._pending.append((IDENTITY_KEY, identity))
        for name in names:
            data = np.concatenate(self._columns[name]).tobytes()
            self._pending.append((column_key(name), data))
            self._pending_bytes += len(data)
        self._columns = {}
        self._commit()
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise unwritable(path, exc) from None
        entries = self._env.stat()["entries"]
        self._env.close()
        self._env = None
        if entries != self._chunk_records + len(names) + 1:
            raise CacheCorrupted(
                f"{path}: wrote {self._chunk_records} records, {len(names)} columns and its "
                f"identity but the chunk holds {entries} entries"
            )
        sha256 = file_sha256(path)
        state = stamp(path, sha256)  # we wrote it: later readers need not hash it again
        self.chunks.append(
            ChunkInfo(info.file, info.records, state.size, sha256, info.columns, info.id)
        )
        self._chunk_records = 0
        self._chunk_bytes = 0
        if self.on_close is not None:
            self.on_close(self.chunks[-1])
