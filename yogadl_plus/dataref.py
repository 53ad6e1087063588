"""DataRef: record ``i`` of a published version, in O(1), from any process; a RecordSource."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import numpy as np

from yogadl_plus.cache.demand import ChunkProvider
from yogadl_plus.cache.fixed import Allocate, FieldSpans, Values
from yogadl_plus.cache.layout import RecordLayout
from yogadl_plus.cache.manifest import ChunkInfo, Manifest
from yogadl_plus.cache.reader import ChunkSet
from yogadl_plus.cache.tokencolumns import TokenChunk
from yogadl_plus.checks import check_index, check_indices, check_selection
from yogadl_plus.order.placement import Placement
from yogadl_plus.order.settings import OrderSettings
from yogadl_plus.recordsource import Leaf, RecordSource
from yogadl_plus.schema import Field, Schema

__all__ = ["DataRef", "DataRefOnDemand"]


class DataRef(RecordSource):
    """Random access to one published version of a dataset.

    Every chunk is checked before a record of it is served (see docs/guarantees.md). ``hold``
    is whatever keeps the files of this version on disk while it is read (the storage's pins):
    kept as long as the DataRef lives, and sent along (it pickles itself) to other processes.
    Picklable: a copy sent to another process opens its own LMDB handles there. As a
    RecordSource, it is what ``ref.stream(...)`` streams: position ``i`` of an unshuffled epoch
    is record ``i``.
    """

    def __init__(self, directory: str, manifest: Manifest, hold: Any = None) -> None:
        self.directory = directory
        self.manifest = manifest
        self._hold = hold
        self._chunks = self._chunk_set(directory, manifest)
        self._chunks.open_first()
        self._layout = RecordLayout(manifest.schema)
        self._len = manifest.num_records
        self._columns = self._chunks.columns()
        self._fingerprint: str | None = None
        # The manifest as it travels to other processes: made once, on the first pickle (a
        # torch DataLoader pickles its dataset for every worker, every epoch).
        self._manifest_text: str | None = None

    def _chunk_set(self, directory: str, manifest: Manifest) -> ChunkSet:
        return ChunkSet(directory, manifest)

    def __getstate__(self) -> dict[str, Any]:
        if self._manifest_text is None:
            self._manifest_text = self.manifest.to_json()
        return {
            "directory": self.directory,
            "manifest": self._manifest_text,
            "hold": self._hold,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        manifest = Manifest.from_json(state["manifest"], state["directory"])
        self.__init__(state["directory"], manifest, state.get("hold"))  # type: ignore[misc]
        self._manifest_text = state["manifest"]

    def __repr__(self) -> str:
        return (
            f"DataRef({self.dataset_id!r}, {self.version!r}, records={self._len}, "
            f"fields={list(self.schema.names)})"
        )

    @property
    def schema(self) -> Schema:
        """The version's fields (names, dtypes, shapes, codecs), as it was built."""
        return self.manifest.schema

    @property
    def dataset_id(self) -> str:
        """The dataset this is a version of."""
        return self.manifest.dataset_id

    @property
    def version(self) -> str:
        """This version's name."""
        return self.manifest.version

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int | slice | Sequence[int] | np.ndarray) -> dict[str, Any]:
        """Record ``index`` (negative counts from the end) as a dict of decoded fields; for a
        slice (``ref[10:13]``), a list or array of indices, or a mask of bools, those records
        as ``get_batch`` gives them (field -> stacked array, or list)."""
        if type(index) is int:  # (the hot path: one record)
            picked: int | np.ndarray = check_index(index, self._len, "DataRef", "record index")
        else:
            picked = check_selection(index, self._len, "DataRef", "record index")
        if isinstance(picked, np.ndarray):
            return self.read_columns(picked, self.schema.fields)
        return self.read_record(picked, self.schema.fields)

    def get_batch(
        self,
        indices: Sequence[int] | np.ndarray,
        fields: Sequence[str] | str | None = None,
        decode: bool = True,
    ) -> dict[str, Any]:
        """The records at ``indices`` as field -> stacked array (a list for variable shapes,
        strings, bytes and nullable fields). Only the fields asked for are decoded. With
        ``decode=False`` image fields (``codecs.Image``) come undecoded: a list of each
        record's stored bytes, the image file (None where null); other fields as ever."""
        stored = () if decode else self._layout.image_fields
        return self.read_columns(self.check_indices(indices), self.select(fields), stored=stored)

    def verify(self, on_chunk: Callable[[ChunkInfo], object] | None = None) -> None:
        """Re-hash every chunk against the manifest; raises CacheCorrupted on a mismatch.
        ``on_chunk(info)`` is called after each chunk that matches (for a progress bar)."""
        self._chunks.verify(on_chunk)

    def close(self) -> None:
        """Release this process's LMDB handles now (they reopen on the next read). Every
        thread of the process reads through them: close only once no thread reads."""
        self._chunks.close()
        self._layout.recycler.clear()

    def read_ahead(self, indices: np.ndarray, now: bool = False) -> None:
        """Records at ``indices`` will be read soon (a Stream says so for the units it reads
        next; ``now``: they are read at once): a version read on demand fetches their chunks in
        the background, a local one asks the disk for their pages (cold disks), ahead of time
        only. A hint: returns at once, and what is read does not change."""
        self._chunks.read_ahead(indices, now)

    # --- token columns (for token blocks, tokenblocks.py) ---

    def token_counts(self, field: str) -> np.ndarray | None:
        """Tokens of ``field`` in each chunk (int64, from the manifest), or None where the
        version keeps no token column of it (built before token columns existed, or the field
        is no 1-D integer array)."""
        chunks = self.manifest.chunks
        if not all(field in c.tokens for c in chunks):
            return None
        return np.fromiter((c.tokens[field] for c in chunks), np.int64, len(chunks))

    def token_chunk(self, field: str, chunk: int) -> TokenChunk:
        """Chunk ``chunk``'s token column of ``field`` (see cache/tokencolumns.py): views valid
        in this thread until its next read. Only where ``token_counts(field)`` is not None
        (else a ValueError saying why); IndexError for a chunk out of range."""
        chunks = self.manifest.chunks
        if type(chunk) is not int and not isinstance(chunk, np.integer):
            raise TypeError(f"token_chunk: chunk must be an int, got {type(chunk).__name__}")
        if not 0 <= chunk < len(chunks):
            raise IndexError(f"token_chunk: chunk {chunk} out of range: {len(chunks)} chunks")
        if field not in chunks[chunk].tokens:
            raise ValueError(
                f"token_chunk: {self.dataset_id}:{self.version} keeps no token column of field "
                f"{field!r} (token_counts({field!r}) is None): it is no 1-D integer field of "
                f"{list(self.schema.names)}, or the version was built before token columns; "
                "read its documents with get_batch, or rebuild the version"
            )
        return self._chunks.token_chunk(int(chunk), field)

    # --- for the Stream and adapters ---

    def select(self, fields: Sequence[str] | str | None) -> tuple[Field, ...]:
        """The Fields named by ``fields`` (a name, names, or None: all); KeyError naming an
        unknown one. (The stream layer reads through this.)"""
        return self.schema.select(fields)

    def check_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """``indices`` as int64 record indices in [0, len) (negatives count from the end);
        TypeError or IndexError otherwise."""
        return check_indices(indices, self._len, "record index")

    def read_record(self, index: int, fields: Sequence[Field]) -> dict[str, Any]:
        """``self[index]``'s ``fields`` for a checked index: one record read alone costs a
        few microseconds, a get_batch of one several times that."""
        return self._layout.decode_record(self._chunks.get(index), fields)

    def read_columns(
        self,
        indices: np.ndarray,
        fields: Sequence[Field],
        allocate: Allocate | None = None,
        stored: Collection[str] = (),
    ) -> dict[str, Any]:
        """get_batch for checked indices and resolved fields (the Stream's hot path). Fields
        kept as whole-chunk columns come from there, without reading the records. ``allocate``
        and ``stored`` (fields handed out as their stored bytes): as
        ``RecordLayout.decode_columns``."""
        if self.has_columns(fields):
            return {f.name: self._chunks.gather(f.name, f.dtype, indices) for f in fields}
        return self._layout.decode_columns(self.read_values(indices), fields, allocate, stored)

    def field_spans(self, fields: Sequence[Field]) -> FieldSpans | None:
        """How ``read_spans`` reads ``fields``, where it can (records of small fixed fields
        only, see ``RecordLayout.field_spans``), else None: those kept as whole-chunk columns
        from there, the others from the record values."""
        spans = self._layout.field_spans(fields)
        return spans.reading_whole(self._columns) if spans is not None else None

    def read_spans(self, indices: np.ndarray, spans: FieldSpans) -> dict[str, np.ndarray] | None:
        """The fields ``spans`` describes (``field_spans``) of the records at checked
        ``indices``, each gathered from the chunk files straight into a new array; None where
        they cannot be (read the values and decode them)."""
        chunks = self._chunks
        gathered = chunks.gather_spans(indices, self._layout.row_bytes, spans.value_spans)
        if gathered is None:
            return None
        return spans.arrays(gathered, lambda name, dtype: chunks.gather(name, dtype, indices))

    def has_columns(self, fields: Sequence[Field]) -> bool:
        """True when every one of ``fields`` is kept as a whole-chunk column."""
        return bool(fields) and self._columns.issuperset(f.name for f in fields)

    def read_values(self, indices: np.ndarray) -> Values:
        """The raw record values at checked indices, valid in this thread until its next read
        transaction ends; decode them with ``layout``. Records of small fixed fields only come
        as the rows of a new array (cache/pagemap.py), others as views into the chunks."""
        return self._chunks.get_many(indices, self._layout.row_bytes)

    @property
    def layout(self) -> RecordLayout:
        """How this version's record values are laid out: decodes what ``read_values`` gives.
        (The stream layer reads through this.)"""
        return self._layout

    @property
    def source_kind(self) -> str:
        """What the version was cached from ("tensorflow", "torch", "parquet", ...)."""
        return self.manifest.source_kind

    # --- as a RecordSource (what a Stream reads) ---

    @property
    def leaves(self) -> tuple[Leaf, ...]:
        """This DataRef, alone (made on each call: a DataRef holding its own Leaf would live on
        until the garbage collector broke the cycle, and its files stayed open till then)."""
        return (Leaf((), self),)

    def identity(self) -> tuple[str, str]:
        """``"dataset_id:version"``, and a digest of this build's chunks (their checksums and
        counts, in order): another build of the version has another."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for chunk in self.manifest.chunks:
                digest.update(f"{chunk.sha256}:{chunk.records};".encode("ascii"))
            self._fingerprint = digest.hexdigest()[:32]
        return f"{self.dataset_id}:{self.version}", self._fingerprint

    def place(self, epoch: int, positions: np.ndarray, shuffle: bool, seed: int) -> Placement:
        """Position ``i`` reads record ``i``, in every epoch."""
        return Placement.whole(positions)

    @property
    def chunk_records(self) -> np.ndarray:
        """Records per chunk, in order (a windowed shuffle and chunk shards work from them)."""
        return np.array([c.records for c in self.manifest.chunks], dtype=np.int64)

    @property
    def record_bytes(self) -> float:
        """Stored bytes per record, on average (what a stream sizes its units of work by)."""
        chunks = self.manifest.chunks
        return max(1.0, sum(c.bytes for c in chunks) / self._len) if self._len else 1.0

    @property
    def chunk_bytes(self) -> float:
        """Stored bytes per chunk, on average."""
        chunks = self.manifest.chunks
        return max(1.0, sum(c.bytes for c in chunks) / len(chunks)) if chunks else 1.0

    def stream_fields(
        self, fields: Sequence[str] | str | None, batching: bool
    ) -> tuple[Field, ...]:
        return self.select(fields)

    def check_stream(self, order: OrderSettings, windows: bool) -> None:
        """A DataRef streams in every order."""


class DataRefOnDemand(DataRef):
    """A DataRef whose chunks come to local disk when a read needs them (or ahead of it, see
    ``read_ahead``), from ``provider``: a bucket's version bigger than its local cache.

    Every read is bracketed for the ChunkSet (``read_begins`` / ``read_ends``), which so knows
    when no thread can hold views into a chunk it retired, and unmaps and unpins it: values a
    read hands out as memoryviews (``read_values``) are valid in the reading thread until its
    next read. Picklable like any DataRef; the copy fetches through the same local cache.
    """

    def __init__(
        self, directory: str, manifest: Manifest, hold: Any, provider: ChunkProvider
    ) -> None:
        self.provider = provider
        super().__init__(directory, manifest, hold)

    def _chunk_set(self, directory: str, manifest: Manifest) -> ChunkSet:
        return ChunkSet(directory, manifest, self.provider)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "provider": self.provider}

    def __setstate__(self, state: dict[str, Any]) -> None:
        manifest = Manifest.from_json(state["manifest"], state["directory"])
        self.__init__(  # type: ignore[misc]
            state["directory"], manifest, state.get("hold"), state["provider"]
        )

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Brackets one read for the ChunkSet (see the class docstring)."""
        self._chunks.read_begins()
        try:
            yield
        finally:
            self._chunks.read_ends()

    def read_record(self, *args: Any) -> dict[str, Any]:
        with self._reading():
            return super().read_record(*args)

    def read_columns(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        with self._reading():
            return super().read_columns(*args, **kwargs)

    def read_values(self, *args: Any) -> Values:
        with self._reading():
            return super().read_values(*args)

    def token_chunk(self, field: str, chunk: int) -> TokenChunk:
        with self._reading():
            return super().token_chunk(field, chunk)
