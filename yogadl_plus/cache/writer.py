"""Writes encoded records into LMDB chunk files, rolling over to a new chunk by size."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import struct
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import lmdb
import numpy as np

from yogadl_plus.cache.integrity import stamp
from yogadl_plus.cache.keys import IDENTITY_KEY, KEY_BYTES, column_key, record_keys, token_key
from yogadl_plus.cache.manifest import MAX_CHUNK_RECORDS, ChunkInfo, chunk_id, new_build_id
from yogadl_plus.cache.pagewriter import PageWriter
from yogadl_plus.cache.tokencolumns import TokenBatch, stored_part, token_places
from yogadl_plus.errors import CacheCorrupted, UnexpectedLayout, unwritable
from yogadl_plus.files import file_sha256

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "ChunkWriter",
    "EqualValues",
    "chunk_file_name",
    "chunk_identity",
]

DEFAULT_CHUNK_BYTES = 256 << 20
_COMMIT_BYTES = 64 << 20
_COMMIT_RECORDS = 50_000
_KEY = struct.Struct(">I")  # a record's key (keys.record_key), packed one at a time in C
assert _KEY.size == KEY_BYTES
# (key, value) pairs for one putmulti, made when the transaction runs (again, if it is retried).
Items = Callable[[], Iterable[tuple[bytes, bytes]]]
# The bytes a record adds to each token column besides its tokens: its ``ends`` and ``eos_ends``.
_TOKEN_RECORD_BYTES = 16


@dataclass(frozen=True)
class EqualValues:
    """Values of ``width`` bytes each, laid end to end in ``data``: a batch of records with
    fixed fields only. They are cut out as LMDB takes them, not made into a list ahead."""

    data: bytes
    width: int

    def __len__(self) -> int:
        return len(self.data) // self.width

    def items(self, first_key: int, start: int, stop: int) -> Iterable[tuple[bytes, bytes]]:
        """(key, value) of values ``start .. stop - 1``, keyed from local index ``first_key``."""
        w = self.width
        cuts = map(slice, range(start * w, stop * w, w), range((start + 1) * w, stop * w + 1, w))
        keys = map(_KEY.pack, range(first_key, first_key + stop - start))
        return zip(keys, map(self.data.__getitem__, cuts))


def chunk_file_name(number: int, prefix: str = "") -> str:
    return f"{prefix}chunk-{number:05d}.mdb"


def chunk_identity(info: ChunkInfo, schema: str, build: str) -> dict[str, Any]:
    """What a chunk says of itself under IDENTITY_KEY (JSON): the id, name (as written) and
    counts its manifest must give it, the digest of the schema its records were encoded with,
    and the build that wrote it (cache format 3: ``build`` is the manifest's; "" before, when
    chunks did not record it), and the tokens of its token columns (format 4, where the
    schema has token fields)."""
    identity = {
        "id": info.id,
        "file": os.path.basename(info.file),
        "records": info.records,
        "columns": list(info.columns),
        "schema": schema,
    }
    if build:
        identity["build"] = build
    if info.tokens:
        identity["tokens"] = dict(info.tokens)
    return identity


class ChunkWriter:
    """Appends record values to ``chunk-NNNNN.mdb`` files in ``directory``.

    A chunk of equal-size records (``EqualValues``) has its records' pages written directly,
    as LMDB lays them out (cache/pagewriter.py), then checked against LMDB's own reading of
    them; a chunk that fails the check is written again by puts. Puts are buffered and written
    in large transactions with MDB_APPEND. If the memory map is too small, the transaction is
    aborted, the map grown, and the same buffered puts written again, so nothing is lost.
    ``prefix`` starts every file name: tasks of a parallel build
    write into one folder without clashing. ``on_close`` is called with each chunk as soon as
    it is complete (a build task hands it on while writing the next). ``schema`` is the digest
    of the schema the values were encoded with, ``build`` the id of the build the chunks are
    part of (None: a build of this writer's own); each chunk records both with its identity,
    and its id is made from the build's (``chunk_id``). ``tokens`` names the token fields
    (cache/tokencolumns.py), each with its position in the schema: every chunk keeps a token
    column of each, made of what ``add_many`` is given. A write that fails (a full disk) is a
    StorageError naming the chunk and the free space.
    """

    def __init__(
        self,
        directory: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        prefix: str = "",
        on_close: Callable[[ChunkInfo], object] | None = None,
        schema: str = "",
        build: str | None = None,
        tokens: Mapping[str, int] | None = None,
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        self.directory = directory
        self.chunk_bytes = chunk_bytes
        self.prefix = prefix
        self.on_close = on_close
        self.schema = schema
        self.build = build if build is not None else new_build_id()
        self.chunks: list[ChunkInfo] = []
        self._env: lmdb.Environment | None = None
        self._pages: PageWriter | None = None  # the current chunk's records, written directly
        self._pending: list[Items] = []
        self._pending_bytes = 0
        self._pending_records = 0
        self._chunk_records = 0
        self._chunk_bytes = 0
        self._map_size = 0
        self._columns: dict[str, list[np.ndarray]] = {}
        self.token_positions = dict(tokens or {})
        self._tokens: dict[str, list[TokenBatch]] = {name: [] for name in self.token_positions}
        self._token_sizes: dict[bytes, int] = {}  # each token part's bytes, unpadded

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
        self,
        values: Sequence[bytes] | EqualValues,
        columns: Mapping[str, np.ndarray] | None = None,
        tokens: Mapping[str, TokenBatch] | None = None,
    ) -> None:
        """Append records in order. ``columns`` are per-record arrays of some fields (one
        element per value) that each chunk also stores whole, under its column key; ``tokens``
        the records' tokens of each token field the writer was made with."""
        tokens = tokens or {}
        if not len(values):  # (a batch of no rows: nothing to slice)
            return
        if tokens.keys() != self.token_positions.keys():
            raise ValueError(
                f"add_many: got tokens of {sorted(tokens)}, the writer keeps token columns of "
                f"{sorted(self.token_positions)}"
            )
        # Bytes taken by the values so far (each with its key and its token columns' share),
        # for filling chunks by size.
        count = len(values)
        if isinstance(values, EqualValues):
            sizes = np.full(count, values.width + KEY_BYTES, np.int64)
        else:
            sizes = np.fromiter(map(len, values), np.int64, count) + KEY_BYTES
            if sizes[0] > KEY_BYTES and (sizes == sizes[0]).all():  # (records of fixed fields)
                values = EqualValues(b"".join(values), int(sizes[0]) - KEY_BYTES)
        offsets = {}
        for name, batch in tokens.items():
            sizes += batch.lengths * batch.tokens.itemsize + _TOKEN_RECORD_BYTES
            offsets[name] = np.concatenate([[0], np.cumsum(batch.lengths)])
        ends = np.cumsum(sizes)
        start = 0
        while start < count:
            if self._env is None and self._pages is None:
                self._open_chunk(values)
            # Fill the current chunk up to its size limit (the value that reaches it included),
            # then roll over.
            before = int(ends[start - 1]) if start else 0
            room = self.chunk_bytes - self._chunk_bytes
            stop = min(int(np.searchsorted(ends, before + room, side="left")) + 1, count)
            stop = min(stop, start + MAX_CHUNK_RECORDS - 1 - self._chunk_records)
            taken = int(ends[stop - 1]) - before
            self._append(values, start, stop)
            for name, column in (columns or {}).items():
                self._columns.setdefault(name, []).append(column[start:stop])
            for name, batch in tokens.items():
                self._tokens[name].append(batch.cut(offsets[name], start, stop))
            self._chunk_records += stop - start
            self._chunk_bytes += taken
            self._pending_bytes += taken
            self._pending_records += stop - start
            if self._pending_bytes >= _COMMIT_BYTES or self._pending_records >= _COMMIT_RECORDS:
                self._commit()
            if (
                self._chunk_bytes >= self.chunk_bytes
                or self._chunk_records >= MAX_CHUNK_RECORDS - 1
            ):
                self._close_chunk()
            start = stop

    def close(self) -> list[ChunkInfo]:
        """Finish the last chunk; returns every chunk written, each checked and hashed."""
        if self._env is not None or self._pages is not None:
            self._close_chunk()
        return self.chunks

    def abort(self) -> None:
        if self._pages is not None:
            self._pages.close()
            self._pages = None
        if self._env is not None:
            self._env.close()
            self._env = None
        self._pending.clear()

    def _path(self, number: int) -> str:
        return os.path.join(self.directory, chunk_file_name(number, self.prefix))

    def _open_chunk(self, values: Sequence[bytes] | EqualValues) -> None:
        """Start the next chunk: a new LMDB file, whose records' pages are written directly
        where they are equal in size (``values``, the first of them, tells)."""
        self._map_size = max(2 * self.chunk_bytes, 64 << 20)
        path = self._path(len(self.chunks))
        self._env = _open_env(path, self._map_size)
        self._chunk_records = 0
        self._chunk_bytes = 0
        if isinstance(values, EqualValues):
            self._env.close()  # (LMDB made the file: its meta pages)
            try:
                self._pages = PageWriter(path, values.width)
                self._env = None
            except UnexpectedLayout:  # (not as LMDB 0.9 makes a file: LMDB writes it all)
                self._env = _open_env(path, self._map_size)

    def _append(self, values: Sequence[bytes] | EqualValues, start: int, stop: int) -> None:
        """Hand on ``values[start:stop]``, the current chunk's next records: to its page
        writer, or to the next commit once LMDB writes the chunk."""
        pages = self._pages
        if pages is not None and isinstance(values, EqualValues) and values.width == pages.width:
            pages.add(memoryview(values.data)[start * values.width : stop * values.width])
            return
        if pages is not None:  # (records of another size: LMDB appends them)
            self._finish_pages()
        self._pending.append(functools.partial(_items, values, self._chunk_records, start, stop))

    def _finish_pages(self) -> None:
        """Finish the records' pages of the current chunk and hand the file to LMDB, checking
        that LMDB reads in it what was written; where it does not, the chunk's records are
        written again by puts, into a new file."""
        pages = self._pages
        assert pages is not None and self._env is None
        self._pages = None
        path = pages.path
        shape = pages.finish(self._map_size)
        self._map_size = max(self._map_size, 2 * os.path.getsize(path))
        self._env = _open_env(path, self._map_size)
        if self._env.stat() == shape.stat() and _reads_as_written(self._env, pages.samples):
            return
        self._env.close()
        again = path + ".again"
        self._env = _open_env(again, self._map_size)
        step = _COMMIT_RECORDS
        for start in range(0, shape.entries, step):
            stop = min(start + step, shape.entries)
            written = EqualValues(pages.written(start, stop), pages.width)
            self._pending.append(functools.partial(written.items, start, 0, stop - start))
            self._commit()
        self._env.close()
        os.replace(again, path)
        self._env = _open_env(path, self._map_size)

    def _token_columns(self) -> tuple[list[tuple[bytes, bytes]], dict[str, int]]:
        """The current chunk's token columns as (key, value) pairs in key order, and the
        tokens of each; their pieces are let go of."""
        items: list[tuple[bytes, bytes]] = []
        counts = {}
        for name, position in self.token_positions.items():
            pieces = self._tokens[name]
            lengths = np.concatenate([piece.lengths for piece in pieces])
            ends = np.cumsum(lengths, dtype="<i8")  # (as every stored number, little-endian)
            parts = {
                "tokens": np.concatenate([piece.tokens for piece in pieces]),
                "ends": ends,
                "eos_ends": ends + np.arange(1, len(ends) + 1, dtype="<i8"),
            }
            for part, array in parts.items():
                key = token_key(position, part)
                self._token_sizes[key] = array.nbytes  # (stored padded: stored_part)
                items.append((key, stored_part(array)))
            counts[name] = len(parts["tokens"])
            self._tokens[name] = []
        return sorted(items), counts

    def _token_places(self) -> list[tuple[bytes, bytes]]:
        """The ``where`` part of each token column just committed (``token_places``)."""
        assert self._env is not None
        with self._env.begin(buffers=True) as txn:
            return token_places(
                txn.get,
                self._env.stat()["psize"],
                self.token_positions.values(),
                self._token_sizes,
            )

    def _commit(self) -> None:
        if self._env is None:  # (records written directly: nothing to commit yet)
            self._pending_bytes = 0
            self._pending_records = 0
            return
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    cursor = txn.cursor()
                    for items in self._pending:
                        cursor.putmulti(items(), append=True)
                break
            except lmdb.MapFullError:
                # The aborted transaction dropped its puts; they are still in self._pending.
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)
            except lmdb.Error as exc:  # a full disk shows as ENOSPC or EIO
                raise unwritable(self._path(len(self.chunks)), exc) from None
        self._pending = []
        self._pending_bytes = 0
        self._pending_records = 0

    def _close_chunk(self) -> None:
        if self._pages is not None:
            self._finish_pages()
        assert self._env is not None
        path = self._path(len(self.chunks))
        names = sorted(self._columns)  # column keys sort after the identity key, by name
        name = os.path.basename(path)
        token_items, counts = self._token_columns()
        info = ChunkInfo(
            name, self._chunk_records, 0, "", tuple(names), chunk_id(self.build, name), counts
        )
        identity = json.dumps(chunk_identity(info, self.schema, self.build)).encode()
        last = [(IDENTITY_KEY, identity)]
        for name in names:
            data = np.concatenate(self._columns[name]).tobytes()
            last.append((column_key(name), data))
        last.extend(token_items)
        self._pending_bytes += sum(len(data) for _, data in last)
        self._pending.append(functools.partial(list, last))
        self._columns = {}
        self._commit()
        if token_items:
            self._pending.append(functools.partial(list, self._token_places()))
            self._commit()
        # The file is whole once committed: it is hashed while the disk makes it durable.
        hashing = _Hash(path)
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise unwritable(path, exc) from None
        finally:
            sha256 = hashing.result()
        entries = self._env.stat()["entries"]
        self._env.close()
        self._env = None
        token_parts = len(token_items) + len(counts) if token_items else 0  # (with "where")
        if entries != self._chunk_records + len(names) + 1 + token_parts:
            raise CacheCorrupted(
                f"{path}: wrote {self._chunk_records} records, {len(names)} columns, "
                f"{token_parts} parts of token columns and its identity but the chunk "
                f"holds {entries} entries"
            )
        state = stamp(path, sha256)  # we wrote it: later readers need not hash it again
        self.chunks.append(dataclasses.replace(info, bytes=state.size, sha256=sha256))
        self._chunk_records = 0
        self._chunk_bytes = 0
        if self.on_close is not None:
            self.on_close(self.chunks[-1])


def _open_env(path: str, map_size: int) -> lmdb.Environment:
    """The LMDB environment of a chunk file being written (made where there is none)."""
    try:
        return lmdb.open(
            path,
            subdir=False,
            map_size=map_size,
            lock=False,
            sync=False,
            metasync=False,
            meminit=False,
            max_dbs=0,
        )
    except (lmdb.Error, OSError) as exc:
        raise unwritable(path, exc) from None


def _reads_as_written(env: lmdb.Environment, samples: Mapping[int, bytes]) -> bool:
    """Whether LMDB's gets of the records sampled give the values written."""
    with env.begin(buffers=True) as txn:
        return all(txn.get(_KEY.pack(i)) == value for i, value in samples.items())


def _items(
    values: Sequence[bytes] | EqualValues, first_key: int, start: int, stop: int
) -> Iterable[tuple[bytes, bytes]]:
    """(key, value) of ``values[start:stop]``, keyed from local index ``first_key``."""
    if isinstance(values, EqualValues):
        return values.items(first_key, start, stop)
    return zip(record_keys(np.arange(first_key, first_key + stop - start)), values[start:stop])


class _Hash:
    """The SHA-256 of a file, computed in a thread of its own (hashlib lets go of the GIL)."""

    def __init__(self, path: str) -> None:
        self._digest: str | BaseException = ""
        self._thread = threading.Thread(target=self._run, args=(path,), name="yogadl-hash")
        self._thread.start()

    def _run(self, path: str) -> None:
        try:
            self._digest = file_sha256(path)
        except BaseException as exc:  # handed to the caller of result()
            self._digest = exc

    def result(self) -> str:
        self._thread.join()
        if isinstance(self._digest, BaseException):
            raise self._digest
        return self._digest
