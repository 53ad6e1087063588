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

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from yogadl_plus import codecs
from yogadl_plus.cache.keys import TOKEN_PARTS, token_key
from yogadl_plus.errors import CacheCorrupted
from yogadl_plus.schema import Field, Schema

__all__ = [
    "TokenBatch",
    "TokenChunk",
    "TokenCounts",
    "TokenField",
    "TokenRange",
    "is_token_field",
    "read_token_chunk",
    "token_fields",
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


def read_token_chunk(
    get: Callable[[bytes], Any], field: TokenField, name: str, records: int, count: int
) -> TokenChunk:
    """The token column of ``field`` (named ``name``) in a chunk whose values ``get(key)``
    gives (buffers into its map: the arrays are views of them, no copy), which its manifest
    entry says holds ``records`` records and ``count`` tokens of the field. CacheCorrupted
    saying what does not fit (the caller names the chunk)."""
    parts = {}
    for part, dtype in zip(TOKEN_PARTS, (field.dtype, np.dtype("<i8"), np.dtype("<i8"))):
        data = get(token_key(field.position, part))
        if data is None or len(data) % dtype.itemsize:
            raise CacheCorrupted(
                f"the {part} of the token column of field {name!r} are missing or cut"
            )
        parts[part] = np.frombuffer(data, dtype)
    chunk = TokenChunk(parts["tokens"], parts["ends"], parts["eos_ends"])
    if (
        len(parts["tokens"]) != count
        or len(chunk.ends) != records
        or len(chunk.eos_ends) != records
        or (records and (chunk.ends[-1] != count or chunk.eos_ends[-1] != count + records))
    ):
        raise CacheCorrupted(
            f"the token column of field {name!r} holds {len(parts['tokens'])} tokens and "
            f"{len(chunk.ends)} document ends, the manifest says {count} tokens in {records} "
            "records"
        )
    return chunk
