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
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

__all__ = ["TokenChunk", "TokenRange"]


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
