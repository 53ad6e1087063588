"""Token columns: every document's tokens of one field, laid end to end per chunk.

A language model trains on blocks cut from the concatenation of its documents' tokens, and a
block spans many short documents: one read per document is the slow way. So a chunk keeps,
besides its records, each *token field* (a 1-D integer array, ``RecordLayout.token_fields``)
as one contiguous array of the chunk's documents' tokens, in record order, with two small
arrays of where each document ends in it. A run of tokens is then one slice of the chunk's
map: a copy of its bytes, as Megatron's ``.bin`` file gives.

They live inside the chunk file, so they are written, hashed, checked, versioned, pushed and
pulled with it; the manifest records each chunk's token count per field, so a block's chunk is
found by arithmetic without opening any other chunk.

This module says what a token field is (``token_fields``), what a chunk's manifest entry
records of its token columns (``TokenCounts``), what a build hands the chunk writer for a
batch of records (``TokenBatch``), and what a reader gets (``TokenChunk``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from yogadl_plus import codecs
from yogadl_plus.cache.keys import token_key
from yogadl_plus.cache.lmdbformat import PAGE_HEADER, overflow_page
from yogadl_plus.errors import CacheCorrupted
from yogadl_plus.schema import Field, Schema

__all__ = [
    "MIN_PART_BYTES",
    "TokenBatch",
    "TokenChunk",
    "TokenCounts",
    "TokenField",
    "TokenRange",
    "is_token_field",
    "read_token_chunk",
    "TokenInfo",
    "stored_part",
    "token_fields",
    "token_places",
]


def is_token_field(field: Field) -> bool:
    """True for a field every chunk keeps a token column of: numbers of an integer dtype in
    one dimension, fixed ``(n,)`` or variable ``(None,)``, nullable or not (a null is a
    document of no tokens)."""
    return field.kind == "numeric" and field.dtype.kind in "iu" and len(field.shape) == 1


def token_fields(schema: Schema) -> tuple[Field, ...]:
    """The fields of ``schema`` that get a token column, in schema order."""
    return tuple(f for f in schema if is_token_field(f))


class TokenCounts(Mapping[str, int]):
    """Field name -> the tokens a chunk's column of it holds: frozen and hashable, as the
    ``ChunkInfo`` that carries it."""

    __slots__ = ("_counts",)

    def __init__(self, counts: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        self._counts = dict(sorted(dict(counts).items()))

    def __getitem__(self, name: str) -> int:
        return self._counts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

    def __hash__(self) -> int:
        return hash(tuple(self._counts.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenCounts):
            return self._counts == other._counts
        return isinstance(other, Mapping) and self._counts == dict(other)

    def __repr__(self) -> str:
        return f"TokenCounts({self._counts!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TokenCounts, (self._counts,))


class TokenBatch(NamedTuple):
    """One token field of a batch of records, as a build hands it to the chunk writer: each
    record's token count (int64; 0 for a null) and all their tokens end to end."""

    lengths: np.ndarray
    tokens: np.ndarray

    @classmethod
    def of_values(cls, field: Field, values: Sequence[np.ndarray | None]) -> TokenBatch:
        """The batch of decoded values (None for a null), each a 1-D array of ``field``."""
        lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values))
        present = [v for v in values if v is not None and len(v)]
        tokens = np.concatenate(present) if present else np.empty(0, field.dtype)
        return cls(lengths, tokens.astype(field.dtype, copy=False))

    @classmethod
    def of_stored(cls, field: Field, stored: Sequence[bytes | memoryview]) -> TokenBatch:
        """The batch of values as ``field``'s codec encoded them (b"" for a null). The raw
        codec's (a uint32 length, then the tokens' bytes) are cut without decoding; other
        codecs' decoded value by value."""
        if not isinstance(field.codec, codecs.Raw):
            decode = field.codec.decode  # type: ignore[union-attr]
            return cls.of_values(field, [decode(field, v) if v else None for v in stored])
        head = 4 * field.num_variable_dims  # (0 for a fixed (n,) field)
        sizes = np.fromiter(map(len, stored), np.int64, len(stored))
        lengths = np.where(sizes > 0, sizes - head, 0) // field.dtype.itemsize
        data = b"".join([memoryview(v)[head:] for v in stored if len(v)])
        return cls(lengths, np.frombuffer(data, field.dtype))

    def cut(self, offsets: np.ndarray, start: int, stop: int) -> TokenBatch:
        """Records ``start .. stop - 1`` of the batch, ``offsets`` being the cumulative sum of
        ``lengths`` with a 0 before it."""
        return TokenBatch(
            self.lengths[start:stop], self.tokens[int(offsets[start]) : int(offsets[stop])]
        )


class TokenRange(Protocol):
    """The tokens of a chunk's documents laid end to end: ``tokens[a:b]`` is an array."""

    def __getitem__(self, cut: slice) -> np.ndarray: ...

    def __len__(self) -> int: ...


class TokenChunk(NamedTuple):
    """One chunk's token column of a field.

    ``tokens``: every document's tokens in record order (the field's dtype), sliceable.
    ``ends``: int64, one per document of the chunk: where its tokens end in ``tokens``.
    ``eos_ends``: int64, ``ends + 1, 2, 3, ...``: where each document ends when every one is
    followed by one more token (an end-of-document token), so that a position in that longer
    concatenation is found by one binary search too.
    """

    tokens: TokenRange
    ends: np.ndarray
    eos_ends: np.ndarray


class TokenField(NamedTuple):
    """A token field as a chunk keeps it: its position in the schema (what its keys name,
    cache/keys.py) and dtype."""

    position: int
    dtype: np.dtype

    @classmethod
    def of_schema(cls, schema: Schema) -> dict[str, TokenField]:
        """Every token field of ``schema``, by name."""
        names = schema.names
        return {f.name: cls(names.index(f.name), f.dtype) for f in token_fields(schema)}


# The parts of a token column that are arrays, in the order ``where`` lists them.
ARRAY_PARTS = ("tokens", "ends", "eos_ends")
_INDEX = np.dtype("<i8")
# (offset, bytes) of each array part in the chunk file, little-endian uint64.
_WHERE = np.dtype("<u8")
#: The fewest bytes an array part is stored in (zeros after its own bytes): LMDB keeps a value
#: this large in pages of its own, which no later write moves, so its place in the file, once
#: read, holds for good. (A smaller value lives inside a B-tree page, copied elsewhere by any
#: later write to that page.)
MIN_PART_BYTES = 4096


def stored_part(array: np.ndarray) -> bytes:
    """A part as its chunk keeps it: its bytes, then zeros up to MIN_PART_BYTES."""
    data = array.tobytes()
    return data + bytes(MIN_PART_BYTES - len(data)) if len(data) < MIN_PART_BYTES else data


def where_value(spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """The ``where`` part: (offset in the chunk file, bytes) of each of ARRAY_PARTS."""
    return np.asarray(spans, _WHERE).reshape(len(ARRAY_PARTS), 2)


def read_token_chunk(
    get: Callable[[bytes], Any], page_size: int, field: TokenField, name: str, info: TokenInfo
) -> TokenChunk:
    """The token column of ``field`` (named ``name``) of a chunk whose values ``get(key)``
    gives (buffers into its map, pages of ``page_size``), as read-only views of the map.

    An LMDB get of a large value reads every page of it first (py-lmdb does, so that no page
    fault happens under the GIL): a whole column for one block. So only the small ``where``
    part is got; it is kept on pages of its own, whose header says where it lies, so the map's
    start is known and the arrays are viewed where ``where`` says they lie. ``info``: the
    chunk as its manifest entry says. CacheCorrupted saying what does not fit (the caller
    names the chunk)."""
    stored = get(token_key(field.position, "where"))
    spans_bytes = len(ARRAY_PARTS) * 2 * _WHERE.itemsize
    if stored is None or len(stored) < max(spans_bytes, MIN_PART_BYTES):
        raise CacheCorrupted(f"the token column of field {name!r} does not say where it lies")
    where = np.frombuffer(stored, np.uint8)
    page = overflow_page(where.ctypes.data)
    if page is None:
        raise CacheCorrupted(f"the token column of field {name!r} is not laid out as written")
    start = where.ctypes.data - PAGE_HEADER - page * page_size  # (of the map: the file's 0)
    spans = where[:spans_bytes].view(_WHERE).reshape(len(ARRAY_PARTS), 2).tolist()
    parts = {}
    for part, dtype, (offset, size) in zip(ARRAY_PARTS, (field.dtype, _INDEX, _INDEX), spans):
        if size % dtype.itemsize or offset % dtype.alignment or offset + size > info.file_bytes:
            raise CacheCorrupted(
                f"the {part} of the token column of field {name!r} lie outside the chunk file "
                f"({size} bytes at {offset} of {info.file_bytes})"
            )
        view = memoryview((ctypes.c_char * size).from_address(start + offset)).cast("B")
        array = np.frombuffer(view, dtype) if size else np.empty(0, dtype)
        array.flags.writeable = False  # (the map's pages are read-only)
        parts[part] = array
    chunk = TokenChunk(parts["tokens"], parts["ends"], parts["eos_ends"])
    count, records = info.tokens, info.records
    if (
        len(chunk.tokens) != count
        or len(chunk.ends) != records
        or len(chunk.eos_ends) != records
        or (records and (chunk.ends[-1] != count or chunk.eos_ends[-1] != count + records))
    ):
        raise CacheCorrupted(
            f"the token column of field {name!r} holds {len(chunk.tokens)} tokens and "
            f"{len(chunk.ends)} document ends, the manifest says {count} tokens in {records} "
            "records"
        )
    return chunk


class TokenInfo(NamedTuple):
    """What a chunk's manifest entry says of one token column: the file's bytes, the
    chunk's records and the column's tokens."""

    file_bytes: int
    records: int
    tokens: int


def token_places(
    get: Callable[[bytes], Any],
    page_size: int,
    positions: Iterable[int],
    sizes: Mapping[bytes, int],
) -> list[tuple[bytes, bytes]]:
    """The ``where`` part of each token column (of the fields at ``positions``) of a chunk
    whose values ``get(key)`` gives, just written: where in the file each array part lies
    (its page, from the header before its bytes) and its bytes (``sizes``, unpadded)."""
    items = []
    for position in positions:
        spans = []
        for part in ARRAY_PARTS:
            key = token_key(position, part)
            value = np.frombuffer(get(key), np.uint8)
            page = overflow_page(value.ctypes.data)
            if page is None or len(value) < MIN_PART_BYTES:
                raise CacheCorrupted(f"token column part {key!r} is not on pages of its own")
            spans.append((page * page_size + PAGE_HEADER, sizes[key]))
        items.append((token_key(position, "where"), stored_part(where_value(spans))))
    return items
