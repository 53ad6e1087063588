"""Token blocks: a dataset of documents read as fixed-length blocks of their tokens.

``ydl.token_blocks(ref, "tokens", length=2048, eos=50256)`` is a record source, like a DataRef,
whose record ``i`` is ``flat[i*length:(i+1)*length]``: ``flat`` is every document's ``field``
(a 1-D integer array; a document is a record of ``ref``, in storage order), each followed by
``eos`` when given; the tail shorter than ``length`` is dropped. This is how language models
are pretrained (Megatron's GPTDataset, litdata's TokensLoader, nanoGPT): no token is padded,
and a block crosses document boundaries. With ``segments=True`` each block also says where
those boundaries are: ``position`` (each token's index in its document, the eos counted as its
last) and ``segment`` (how many documents begin after the block's first token, up to this one),
what attention masks that do not cross documents are made of.

Blocks are found by arithmetic on per-chunk token counts, never by a pass over the documents:
``len``, a shuffled epoch and its first batch cost O(chunks) however many documents there are.
A version whose chunks keep token columns (``DataRef.token_counts``) reads a block as slices of
them, about what copying its bytes costs (tokencut.py). A version without them (built before
token columns existed) still works: the first use reads every document's length once (O(N):
about a second or two per million documents), and blocks are read through ``get_batch``.

As a RecordSource it streams with every argument a DataRef's stream takes (shuffle, shards,
offsets, elastic resume, workers of every type, predicates over "tokens", "position" and
"segment", skip lists of block indices, transforms, batches), goes into ``ydl.mix`` beside
DataRefs and mixtures, and its lineage is block indices (``documents(i)`` names a block's
documents). The stream layer reads it as it reads a DataRef (``LeafSource``): each block is a
record of fixed-shape fields.
"""

from __future__ import annotations

import hashlib
import itertools
import numbers
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from yogadl_plus.cache.fixed import Allocate, FieldSpans, Values
from yogadl_plus.cache.layout import MAX_RECORD_BYTES, RecordLayout
from yogadl_plus.cache.tokencolumns import TokenChunk, is_token_field
from yogadl_plus.checks import check_index, check_indices, check_selection
from yogadl_plus.dataref import DataRef, DataRefOnDemand
from yogadl_plus.errors import CacheCorrupted, SchemaError
from yogadl_plus.order.placement import Placement
from yogadl_plus.order.settings import OrderSettings
from yogadl_plus.recordsource import Leaf, RecordSource
from yogadl_plus.schema import Field, Schema
from yogadl_plus.tokencut import Cut, block_documents, cut_blocks, pieces

__all__ = ["TokenBlocks", "token_blocks"]

# Documents whose lengths one get_batch reads, where a version without token columns is scanned.
_SCAN_BATCH = 4096


def token_blocks(
    ref: DataRef,
    field: str = "tokens",
    length: int = 2048,
    *,
    eos: int | None = None,
    segments: bool = False,
) -> TokenBlocks:
    """The documents of ``ref`` (its records) as blocks of ``length`` tokens of ``field``,
    laid end to end with ``eos`` after each one when given; see ``TokenBlocks``.

    ``field`` must be a 1-D integer array (shape ``(n,)`` or ``(None,)``; a null value is an
    empty document), else a SchemaError naming it; ``length`` an int >= 1; ``eos`` None or an
    int the field's dtype holds; ``segments=True`` adds "position" and "segment" to each
    block. Returns at once: nothing is read until the blocks are.
    """
    return TokenBlocks(ref, field, length, eos=eos, segments=segments)


@dataclass(frozen=True)
class _Index:
    """Where the flat tokens lie: ``cum[c]`` flat tokens (eos included) before chunk ``c``
    (then the total), ``documents[c]`` documents before it (then all). ``ends``/``eos_ends``:
    each chunk's documents' ends, for a version scanned (no token columns), else None."""

    cum: np.ndarray
    documents: np.ndarray
    ends: tuple[np.ndarray, ...] | None = None
    eos_ends: tuple[np.ndarray, ...] | None = None


class TokenBlocks(RecordSource):
    """A DataRef's documents as blocks of ``length`` tokens (see ``ydl.token_blocks``).

    ``len(blocks)``; ``blocks[i]`` (negative counts from the end; slices, lists and masks as
    ``get_batch``) -> ``{"tokens": (length,) array of the field's dtype}``, with
    ``segments=True`` also ``"position"`` (int64) and ``"segment"`` (int32);
    ``blocks.get_batch(indices, fields=None)`` stacks them; ``blocks.documents(i)`` names the
    documents block ``i`` is cut from; ``blocks.stream(...)`` takes every argument
    ``DataRef.stream`` takes (not ``ngram=``: blocks are windows already). Picklable: it
    travels as its DataRef and settings, with the index it has computed.
    """

    def __init__(
        self,
        ref: DataRef,
        field: str = "tokens",
        length: int = 2048,
        *,
        eos: int | None = None,
        segments: bool = False,
    ) -> None:
        if not isinstance(ref, DataRef):
            raise TypeError(
                f"token blocks are cut from one DataRef's documents, got {type(ref).__name__}; "
                "to mix several datasets, make the token blocks of each and ydl.mix them"
            )
        self.ref = ref
        self.field = field
        self.dtype: np.dtype = _token_field(ref.schema, field).dtype
        self.length = _checked_length(length)
        self.eos = _checked_eos(eos, self.dtype)
        if not isinstance(segments, (bool, np.bool_)):
            raise TypeError(f"segments must be a bool, got {segments!r}")
        self.segments = bool(segments)
        made = [Field("tokens", self.dtype, (self.length,))]
        if self.segments:
            made += [
                Field("position", np.int64, (self.length,)),
                Field("segment", np.int32, (self.length,)),
            ]
        self._schema = Schema(made)
        self._layout = _block_layout(self._schema, self.length)
        self._index: _Index | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "field": self.field,
            "length": self.length,
            "eos": self.eos,
            "segments": self.segments,
            "index": self._index,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["ref"], state["field"], state["length"], eos=state["eos"],
            segments=state["segments"],
        )  # fmt: skip
        self._index = state["index"]

    def __repr__(self) -> str:
        eos = f", eos={self.eos}" if self.eos is not None else ""
        segments = ", segments=True" if self.segments else ""
        # (The number of blocks only once known: a version without token columns is scanned
        # for it, which a repr must not set off.)
        blocks = f", blocks={len(self)}" if self._index is not None else ""
        return (
            f"TokenBlocks({self.ref!r}, field={self.field!r}, length={self.length}{eos}"
            f"{segments}{blocks})"
        )

    # --- what a user sees ---

    def __len__(self) -> int:
        return int(self.index.cum[-1]) // self.length

    def __getitem__(self, index: int | slice | Sequence[int] | np.ndarray) -> dict[str, Any]:
        """Block ``index`` (negative counts from the end) as field -> (length,) array; for a
        slice, a list or array of indices, or a mask of bools, those blocks as ``get_batch``
        gives them."""
        picked = check_selection(index, len(self), "TokenBlocks", "block index")
        if isinstance(picked, np.ndarray):
            return self.read_columns(picked, self._schema.fields)
        return self.read_record(picked, self._schema.fields)

    def get_batch(
        self,
        indices: Sequence[int] | np.ndarray,
        fields: Sequence[str] | str | None = None,
        decode: bool = True,
    ) -> dict[str, Any]:
        """The blocks at ``indices`` (any order, repeats allowed) as field -> (n, length)
        array. ``decode`` is accepted for the same calls as a DataRef's (blocks hold no
        images)."""
        return self.read_columns(self.check_indices(indices), self.select(fields))

    def documents(self, index: int) -> np.ndarray:
        """The documents block ``index`` is cut from, in order: an int64 array (k, 3) of rows
        (document index, first, stop), the range of that document's positions (as "position"
        counts them: its eos is position n) the block holds. Documents with no token in it
        (empty ones, without eos) are left out."""
        i = check_index(index, len(self), "TokenBlocks", "block index")
        index_ = self.index
        return block_documents(
            i * self.length,
            self.length,
            index_.cum,
            self.read_chunk,
            index_.documents,
            self.eos is not None,
        )

    def close(self) -> None:
        """Release this process's LMDB handles of the DataRef (they reopen on the next read)."""
        self.ref.close()

    # --- what the stream layer reads of a leaf (LeafSource) ---

    @property
    def schema(self) -> Schema:
        """A block's fields: "tokens" (length,) of the field's dtype; with segments also
        "position" int64 (length,) and "segment" int32 (length,)."""
        return self._schema

    @property
    def layout(self) -> RecordLayout:
        """How a block's row (``read_values``) is laid out: its fields' bytes, one after the
        other."""
        return self._layout

    def select(self, fields: Sequence[str] | str | None) -> tuple[Field, ...]:
        """The block fields named by ``fields`` (a name, names, or None: all); SchemaError
        naming an unknown one."""
        return self._schema.select(fields)

    def check_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """``indices`` as int64 block indices in [0, len) (negatives count from the end);
        TypeError or IndexError otherwise."""
        return check_indices(indices, len(self), "block index")

    def read_values(self, indices: np.ndarray) -> np.ndarray:
        """The blocks at checked ``indices`` as rows of a uint8 array, one a block, laid out as
        ``layout`` decodes them."""
        rows = np.empty((len(indices), self._layout.fixed_end), np.uint8)
        fields = [self._field_of(rows, f) for f in self._schema.fields]
        self._cut(indices, self.segments, Cut(*fields, *[None] * (3 - len(fields))))
        return rows

    def field_spans(self, fields: Sequence[Field]) -> None:
        """None: blocks are cut from the token columns, never gathered from chunk files."""
        return None

    def read_spans(self, indices: np.ndarray, spans: FieldSpans) -> None:
        """None: blocks are cut from the token columns, not gathered (see ``read_columns``)."""
        return None

    def has_columns(self, fields: Sequence[Field]) -> bool:
        """False: no block field is kept as a whole-chunk column."""
        return False

    def read_columns(
        self, indices: np.ndarray, fields: Sequence[Field], allocate: Allocate | None = None
    ) -> dict[str, Any]:
        """``fields`` of the blocks at checked ``indices``, as (n, length) arrays (made by
        ``allocate``, np.empty's contract, where given)."""
        if allocate is not None:
            return self._layout.decode_columns(self.read_values(indices), fields, allocate)
        with_marks = any(f.name != "tokens" for f in fields)
        cut = self._cut(indices, with_marks)
        made = {"tokens": cut.tokens, "position": cut.position, "segment": cut.segment}
        return {f.name: made[f.name] for f in fields}

    def read_record(self, index: int, fields: Sequence[Field]) -> dict[str, Any]:
        """Block ``index`` (checked)'s ``fields``, each a (length,) array."""
        batch = self.read_columns(np.array([index], np.int64), fields)
        return {name: column[0] for name, column in batch.items()}

    def read_ahead(self, indices: np.ndarray, now: bool = False) -> None:
        """The blocks at ``indices`` will be read soon: to a version read on demand, the first
        document of every chunk they take tokens from is announced, in the order they are read
        (it fetches those chunks in the background; a block may span many small chunks). A
        local version is told nothing: its hints are of records' pages, and blocks read the
        token columns, not the records (hinting them cost a stream of blocks over a hundred
        chunks 40% of its speed)."""
        if not isinstance(self.ref, DataRefOnDemand):
            return
        index = self.index
        spanned = pieces(np.asarray(indices, np.int64) * self.length, self.length, index.cum)
        documents = index.documents[spanned.chunk]
        # (``now`` named only where set: a hint's usual call is of the records alone.)
        if now:
            self.ref.read_ahead(documents, now=True)
        else:
            self.ref.read_ahead(documents)

    @property
    def record_bytes(self) -> float:
        """The bytes of one block's row."""
        return float(self._layout.fixed_end)

    @property
    def chunk_bytes(self) -> float:
        """The DataRef's stored bytes per chunk."""
        return self.ref.chunk_bytes

    @property
    def source_kind(self) -> str:
        """What the DataRef was cached from."""
        return self.ref.source_kind

    # --- as a RecordSource (what a Stream reads) ---

    @property
    def leaves(self) -> tuple[Leaf, ...]:
        """These blocks, alone: the stream layer reads them as it reads a DataRef."""
        return (Leaf((), self),)

    def identity(self) -> tuple[str, str]:
        """``"token_blocks(dataset:version, field, length, eos=..., segments=True)"`` (eos and
        segments where given), and a digest of the DataRef's build and every setting that
        decides what a block holds. The name says every setting, so a stream state loaded into
        blocks made otherwise is refused naming the one that differs."""
        name, build = self.ref.identity()
        digest = hashlib.sha256(
            f"{build}\0{self.field}\0{self.length}\0{self.eos}\0{self.segments}".encode()
        )
        eos = f", eos={self.eos}" if self.eos is not None else ""
        segments = ", segments=True" if self.segments else ""
        named = f"token_blocks({name}, {self.field}, {self.length}{eos}{segments})"
        return named, digest.hexdigest()[:32]

    def place(self, epoch: int, positions: np.ndarray, shuffle: bool, seed: int) -> Placement:
        """Position ``i`` reads block ``i``, in every epoch."""
        return Placement.whole(positions)

    @property
    def chunk_records(self) -> np.ndarray:
        """Blocks per chunk of the DataRef, by the chunk each block begins in (they sum to
        ``len``)."""
        index = self.index
        begun = np.minimum(len(self), -(-index.cum // self.length))
        return np.diff(begun)

    def stream_fields(
        self, fields: Sequence[str] | str | None, batching: bool
    ) -> tuple[Field, ...]:
        return self.select(fields)

    def check_stream(self, order: OrderSettings, windows: bool) -> None:
        """Token blocks stream in every order; n-gram windows of them: ValueError."""
        if windows:
            raise ValueError(
                "ngram= windows over token blocks: a block is already a window of the "
                "documents' tokens; choose its length instead (token_blocks(..., length=))"
            )

    # --- the index, and reading ---

    @property
    def index(self) -> _Index:
        """Where the flat tokens lie, per chunk: from the manifest's token counts (O(chunks)),
        or, for a version without token columns, from every document's length, read once."""
        if self._index is None:
            with self._lock:
                if self._index is None:
                    self._index = _indexed(self.ref, self.field, self.eos is not None)
        return self._index

    def read_chunk(self, chunk: int) -> TokenChunk:
        """Chunk ``chunk``'s token column of the field: the DataRef's (views valid until its
        next read in this thread, checked against the manifest's counts, which the index is
        made of); or, scanned, one that reads its documents through ``get_batch``."""
        index = self.index
        if index.ends is not None:
            eos_ends = index.eos_ends[chunk] if index.eos_ends is not None else index.ends[chunk]
            tokens = _ScannedTokens(
                self.ref, self.field, int(index.documents[chunk]), index.ends[chunk], self.dtype
            )
            return TokenChunk(tokens, index.ends[chunk], eos_ends)
        return self.ref.token_chunk(self.field, chunk)

    def _cut(self, indices: np.ndarray, marks: bool, out: Cut | None = None) -> Cut:
        if out is None:
            out = Cut.empty(len(indices), self.length, self.dtype, marks)
        if not len(indices):
            return out
        starts = np.asarray(indices, np.int64) * self.length
        return cut_blocks(
            starts, self.length, self.index.cum, self.read_chunk, self.dtype, self.eos, marks, out
        )

    def _field_of(self, rows: np.ndarray, field: Field) -> np.ndarray:
        """Field ``field`` of every block's row in ``rows`` (uint8, a row each), as an array."""
        start = self._layout.offset[field.name]
        return rows[:, start : start + field.nbytes].view(field.dtype)


class _ScannedTokens:
    """A chunk's documents' tokens end to end, for a version without token columns:
    ``[a:b]`` reads the documents holding them (one get_batch)."""

    def __init__(
        self, ref: DataRef, field: str, first: int, ends: np.ndarray, dtype: np.dtype
    ) -> None:
        self.ref, self.field, self.first, self.ends, self.dtype = ref, field, first, ends, dtype

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def __getitem__(self, cut: slice) -> np.ndarray:
        a, b, _ = cut.indices(len(self))
        if b <= a:
            return np.empty(0, self.dtype)
        ends = self.ends
        j0 = int(np.searchsorted(ends, a, "right"))
        j1 = min(int(np.searchsorted(ends, b, "left")) + 1, len(ends))
        docs = np.arange(self.first + j0, self.first + j1)
        tokens = _joined(self.ref.get_batch(docs, [self.field])[self.field], self.dtype)
        begin = int(ends[j0 - 1]) if j0 else 0
        return tokens[a - begin : b - begin]


def _joined(values: Any, dtype: np.dtype) -> np.ndarray:
    """A get_batch column of 1-D values (stacked, or a list with None for nulls) end to end."""
    if isinstance(values, np.ndarray):
        return values.reshape(-1)
    present = [v for v in values if v is not None]
    return np.concatenate(present).astype(dtype, copy=False) if present else np.empty(0, dtype)


def _indexed(ref: DataRef, field: str, eos: bool) -> _Index:
    """The index of ``ref``'s flat tokens: from its token counts, else scanned."""
    records = np.asarray(ref.chunk_records, np.int64)
    documents = np.concatenate([[0], np.cumsum(records)])
    counts = ref.token_counts(field)
    if counts is not None:
        counts = np.asarray(counts, np.int64)
        if counts.shape != records.shape:
            raise CacheCorrupted(
                f"the manifest has token counts of field {field!r} for {len(counts)} chunks, "
                f"but the version has {len(records)}; run storage.verify() and rebuild it"
            )
        flat = counts + records if eos else counts
        return _Index(np.concatenate([[0], np.cumsum(flat)]), documents)
    ends = tuple(
        _scanned_ends(ref, field, int(a), int(b)) for a, b in itertools.pairwise(documents.tolist())
    )
    eos_ends = tuple(e + np.arange(1, len(e) + 1) for e in ends) if eos else None
    lasts = [int(e[-1]) if len(e) else 0 for e in (eos_ends or ends)]
    return _Index(
        np.concatenate([[0], np.cumsum(lasts, dtype=np.int64)]), documents, ends, eos_ends
    )


def _scanned_ends(ref: DataRef, field: str, first: int, stop: int) -> np.ndarray:
    """Where each of documents [first, stop) ends in their tokens end to end (int64): their
    lengths, read (a fixed shape's are known)."""
    spec = ref.schema[field]
    if spec.shape[0] is not None and not spec.nullable:
        return np.arange(1, stop - first + 1, dtype=np.int64) * int(spec.shape[0])
    lengths = np.zeros(stop - first, np.int64)
    for a in range(first, stop, _SCAN_BATCH):
        b = min(a + _SCAN_BATCH, stop)
        values = ref.get_batch(np.arange(a, b), [field])[field]
        lengths[a - first : b - first] = [0 if v is None else len(v) for v in values]
    return np.cumsum(lengths)


def _token_field(schema: Schema, name: object) -> Field:
    """The field ``name`` of ``schema``, checked to be a 1-D integer array."""
    if not isinstance(name, str):
        raise TypeError(f"field must be the name of a field (a str), got {name!r}")
    field = schema[name]  # (a SchemaError naming it and listing the fields)
    if not is_token_field(field):
        raise SchemaError(
            f"field {name!r} is {field.describe()}: token blocks need a 1-D array of integers "
            "(token ids, shape (n,) or (None,)); tokenize the text into such a field when "
            "building the version"
        )
    return field


def _checked_length(length: object) -> int:
    if isinstance(length, (bool, np.bool_)) or not isinstance(length, numbers.Integral):
        raise TypeError(f"length must be an int (tokens per block), got {length!r}")
    if length < 1:
        raise ValueError(f"length must be at least 1 token per block, got {length}")
    return int(length)


class _BlockLayout(RecordLayout):
    """A block's row: a record of fixed fields only. Rows are made anew for each read, never
    recycled, so a field that is the whole row is handed out as a view of them, not copied
    again; into ``allocate`` (a process worker's shared ring) they are copied as ever."""

    def decode_columns(
        self,
        values: Values,
        fields: Sequence[Field],
        allocate: Allocate | None = None,
        stored: Collection[str] = (),
    ) -> dict[str, Any]:
        if (
            allocate is None
            and isinstance(values, np.ndarray)
            and len(fields) == 1
            and fields[0].nbytes == self.fixed_end
        ):
            f = fields[0]
            return {f.name: values.view(f.dtype).reshape(len(values), *f.shape)}
        return super().decode_columns(values, fields, allocate, stored)


def _block_layout(schema: Schema, length: int) -> RecordLayout:
    """How a block's row is laid out; ValueError naming ``length`` where one block would be
    more bytes than a row can hold."""
    try:
        return _BlockLayout(schema)
    except SchemaError:
        size = sum(f.nbytes for f in schema)
        raise ValueError(
            f"length={length} makes a block of {size:,} bytes ({', '.join(schema.names)}), "
            f"over the {MAX_RECORD_BYTES:,} one block can hold: choose a shorter length"
        ) from None


def _checked_eos(eos: object, dtype: np.dtype) -> int | None:
    if eos is None:
        return None
    if isinstance(eos, (bool, np.bool_)) or not isinstance(eos, numbers.Integral):
        raise TypeError(f"eos must be None or an int (a token id), got {eos!r}")
    info = np.iinfo(dtype)
    if not info.min <= int(eos) <= info.max:
        raise ValueError(
            f"eos={int(eos)} does not fit the field's dtype {dtype.name} "
            f"([{info.min}, {info.max}]): give a token id of its vocabulary"
        )
    return int(eos)
