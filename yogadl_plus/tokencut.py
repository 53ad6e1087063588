"""Token blocks cut out of token columns: the arithmetic, over numpy arrays, with no I/O.

A dataset's *flat* token stream is every document's tokens in storage order, each followed by
an end-of-document token ``eos`` when one is given; block ``i`` is ``flat[i*L:(i+1)*L]``. The
documents are stored in chunks, each with a token column (``TokenChunk``: its documents'
tokens end to end, and where each document ends), and ``cum`` counts the flat tokens before
each chunk (``cum[c]``; ``cum[-1]`` is the total). So a block is found by arithmetic:

- its flat range is split at chunk boundaries (``pieces``: a binary search in ``cum``; a block
  may span several chunks, even many tiny ones, and empty chunks give no piece);
- each piece is one slice of its chunk's tokens; with ``eos``, the end-of-document tokens that
  fall inside it are put in between, found by a binary search in the chunk's ``eos_ends``;
- positions and segments come from the documents starting inside each piece, again by binary
  search, then a running maximum (positions) and a running count (segments) over the batch.

Every step works on arrays the size of the batch (its pieces, its blocks, its tokens): nothing
loops over documents in Python. ``read(c)`` gives chunk ``c``'s column; its views may die at
the next read, so each chunk is done with before the next one is asked for, and only copies
outlive it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from yogadl_plus.cache.tokencolumns import TokenChunk, TokenRange

__all__ = ["Cut", "Pieces", "ReadChunk", "block_documents", "cut_blocks", "pieces"]

#: Chunk ``c``'s token column (views valid until the next call).
ReadChunk = Callable[[int], TokenChunk]

_BEFORE_ANY = np.iinfo(np.int64).min


class Pieces(NamedTuple):
    """Blocks' flat ranges cut at chunk boundaries, in output order (block by block, each from
    its first token): piece ``k`` is chunk ``chunk[k]``'s flat tokens ``[lo[k], hi[k])``
    (counted in that chunk, end-of-document tokens included), written to block ``row[k]`` of
    the batch from its column ``column[k]``."""

    row: np.ndarray
    chunk: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    column: np.ndarray


class Cut(NamedTuple):
    """A batch of blocks: ``tokens`` (B, L) of the field's dtype; with segments, ``position``
    (B, L) int64 and ``segment`` (B, L) int32, else None."""

    tokens: np.ndarray
    position: np.ndarray | None
    segment: np.ndarray | None


def pieces(starts: np.ndarray, length: int, cum: np.ndarray) -> Pieces:
    """The flat ranges ``[starts[b], starts[b] + length)`` cut at the chunk boundaries ``cum``
    (int64, one more than the chunks: the flat tokens before each chunk, then the total)."""
    starts = np.asarray(starts, dtype=np.int64)
    stops = starts + length
    first = np.searchsorted(cum, starts, "right") - 1
    last = np.searchsorted(cum, stops, "left") - 1
    if np.array_equal(first, last):  # (the usual case: every block inside one chunk)
        lo = starts - cum[first]
        return Pieces(np.arange(len(starts)), first, lo, lo + length, np.zeros_like(lo))
    row, chunk = _spread(first, last - first + 1)
    base = cum[chunk]
    lo = np.maximum(starts[row], base)
    hi = np.minimum(stops[row], cum[chunk + 1])
    cut = Pieces(row, chunk, lo - base, hi - base, lo - starts[row])
    kept = hi > lo  # (chunks with no flat token give no piece)
    return cut if kept.all() else Pieces(*(part[kept] for part in cut))


def cut_blocks(
    starts: np.ndarray,
    length: int,
    cum: np.ndarray,
    read: ReadChunk,
    dtype: np.dtype,
    eos: int | None = None,
    segments: bool = False,
) -> Cut:
    """The blocks of ``length`` flat tokens beginning at ``starts`` (any order, repeats
    allowed; each block within ``cum[-1]``), read chunk by chunk through ``read``: one call per
    chunk the batch touches."""
    cut = pieces(starts, length, cum)
    n = len(starts)
    tokens = np.empty((n, length), dtype)
    flat = tokens.reshape(-1)
    # The pieces by chunk (each chunk's a run of them), each knowing its place in the batch.
    k, runs = _by_chunk(cut.chunk)
    at, lo, hi, chunks = cut.row * length + cut.column, cut.lo, cut.hi, cut.chunk
    if len(runs) > 1:
        at, lo, hi, chunks = at[k], lo[k], hi[k], chunks[k]
    marks = _Marks(n, length) if segments else None
    packed = _Packed(len(k), dtype) if eos is not None else None
    for g, (a, b) in enumerate(runs):
        chunk = read(int(chunks[a]))
        if packed is None:
            ends = chunk.ends
            _copy_pieces(flat, chunk.tokens, at[a:b], lo[a:b], hi[a:b])
        else:
            ends = chunk.eos_ends
            # (Views die at the next read: copied where another chunk follows.)
            packed.add(chunk, k[a:b], at[a:b], lo[a:b], hi[a:b], copy=g < len(runs) - 1)
        if marks is not None:
            marks.add(ends, at[a:b], lo[a:b], hi[a:b])
    if packed is not None:
        assert eos is not None
        packed.fill(flat, eos)
    if marks is None:
        return Cut(tokens, None, None)
    return Cut(tokens, *marks.result())


def block_documents(
    start: int,
    length: int,
    cum: np.ndarray,
    read: ReadChunk,
    first_record: np.ndarray,
    eos: bool,
) -> np.ndarray:
    """The documents of the block of ``length`` flat tokens from ``start``, in order, as int64
    rows (document index, first, stop): the positions of that document (eos counted as its
    last) the block holds. ``first_record[c]``: the documents before chunk ``c``; ``eos``:
    whether documents end with one. Documents that give the block no token are left out."""
    rows = []
    cut = pieces(np.array([start]), length, cum)
    for c, lo, hi in zip(cut.chunk.tolist(), cut.lo.tolist(), cut.hi.tolist()):
        chunk = read(c)
        ends = np.asarray(chunk.eos_ends if eos else chunk.ends)
        # The documents ending after lo and beginning before hi.
        doc = np.arange(
            np.searchsorted(ends, lo, "right"),
            min(int(np.searchsorted(ends, hi, "left")) + 1, len(ends)),
        )
        stop = ends[doc]
        begin = np.where(doc > 0, ends[np.maximum(doc - 1, 0)], 0)
        first = np.maximum(begin, lo) - begin
        last = np.minimum(stop, hi) - begin
        found = np.stack([doc + first_record[c], first, last], axis=1).astype(np.int64)
        rows.append(found[last > first])
    return np.concatenate(rows) if rows else np.zeros((0, 3), np.int64)


def _spread(first: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For runs of ``counts[k]`` integers from ``first[k]``: which run each integer of them
    belongs to, and the integer (all runs, in order, vectorized)."""
    if len(counts) == 1:  # (one run: a piece of a chunk touched by no other piece)
        return np.zeros(counts[0], np.int64), np.arange(first[0], first[0] + counts[0])
    owner = np.repeat(np.arange(len(counts)), counts)
    offsets = np.cumsum(counts) - counts
    return owner, np.arange(len(owner), dtype=np.int64) + (first - offsets)[owner]


def _by_chunk(chunks: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """An order of the pieces that puts each chunk's together, and the runs ``[a, b)`` of
    that order, one per chunk the pieces touch."""
    if np.all(chunks == chunks[0]):  # (pieces is never empty: a batch has a block)
        return np.arange(len(chunks)), [(0, len(chunks))]
    order = np.argsort(chunks, kind="stable")
    bounds = [0, *(np.flatnonzero(np.diff(chunks[order])) + 1).tolist(), len(chunks)]
    return order, list(itertools.pairwise(bounds))


def _copy_pieces(
    flat: np.ndarray, tokens: TokenRange, at: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> None:
    """Without eos a piece is a run of its chunk's tokens: one slice copy each."""
    for where, a, b in zip(at.tolist(), lo.tolist(), hi.tolist()):
        flat[where : where + b - a] = tokens[a:b]


class _Packed:
    """With eos: the pieces' tokens (in output order) and where the eos tokens go between
    them, put together in one vectorized fill once every chunk is read."""

    def __init__(self, pieces: int, dtype: np.dtype) -> None:
        self.slices: list[np.ndarray] = [np.empty(0, dtype)] * pieces
        self.eos_at: list[np.ndarray] = []

    def add(
        self,
        chunk: TokenChunk,
        ks: np.ndarray,
        at: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
        copy: bool,
    ) -> None:
        """Pieces ``ks`` of one chunk: flat ``[lo, hi)`` of it, to ``at`` in the batch."""
        ends = chunk.eos_ends
        # Before flat position p of the chunk lie p - k tokens, k the documents ended by then.
        done_lo = np.searchsorted(ends, lo, "right")
        done_hi = np.searchsorted(ends, hi, "right")
        first, stop = (lo - done_lo).tolist(), (hi - done_hi).tolist()
        for k, a, b in zip(ks.tolist(), first, stop):
            piece = np.asarray(chunk.tokens[a:b])
            self.slices[k] = piece.copy() if copy else piece
        # The eos of each document ending inside a piece: the last flat token of it.
        owner, doc = _spread(done_lo, done_hi - done_lo)
        self.eos_at.append(at[owner] + ends[doc] - 1 - lo[owner])

    def fill(self, flat: np.ndarray, eos: int) -> None:
        """The batch: eos tokens where they go, the pieces' tokens everywhere else."""
        at = np.concatenate(self.eos_at) if self.eos_at else np.zeros(0, np.int64)
        if not len(at):
            flat[:] = np.concatenate(self.slices)
            return
        rest = np.ones(len(flat), bool)
        rest[at] = False
        flat[rest] = np.concatenate(self.slices)
        flat[at] = eos


class _Marks:
    """Where documents start in a batch of blocks (flat, in the batch): what positions and
    segments are made of."""

    def __init__(self, n: int, length: int) -> None:
        self.n, self.length = n, length
        self.starts: list[np.ndarray] = [np.arange(n, dtype=np.int64) * length]
        self.begins: list[np.ndarray] = []

    def add(self, ends: np.ndarray, at: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """The pieces of one chunk whose documents end at ``ends`` (flat, in the chunk): a
        document starts at 0 and at every end, so at those in ``[lo, hi)`` of each piece
        (which lies in the batch from ``at``). Where a piece begins, its first token's
        position is how far into its document it lies."""
        inside_lo = np.searchsorted(ends, lo, "left")
        owner, doc = _spread(inside_lo, np.searchsorted(ends, hi, "left") - inside_lo)
        self.starts.append(at[owner] + ends[doc] - lo[owner])
        self.starts.append(at[lo == 0])
        done = np.searchsorted(ends, lo, "right")
        self.begins.append(np.stack([at, lo - np.where(done > 0, ends[done - 1], 0)]))

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(position int64 (B, L), segment int32 (B, L)): the batch cut into runs at each
        block's first token and at each document start; positions count up along a run from
        its first token's, segments count the runs of a block after its first."""
        n, length = self.n, self.length
        starts = np.sort(np.concatenate(self.starts))
        fresh = np.ones(len(starts), bool)  # (empty documents, without eos, start alike)
        np.not_equal(starts[1:], starts[:-1], out=fresh[1:])
        starts = starts[fresh]
        sizes = _gaps(starts, n * length)
        # A run's first token is at position 0 where a document starts there, else (only at a
        # block's first token) where that block's first piece says.
        base = np.zeros(len(starts), np.int64)
        at, position = np.concatenate(self.begins, axis=1)
        base[np.searchsorted(starts, at)] = position
        positions = np.arange(n * length, dtype=np.int64) - np.repeat(starts - base, sizes)
        first_run = np.searchsorted(starts, self.starts[0])
        counted = np.arange(len(starts), dtype=np.int32) - np.repeat(
            first_run.astype(np.int32), _gaps(first_run, len(starts))
        )
        segment = np.repeat(counted, sizes)
        return positions.reshape(n, length), segment.reshape(n, length)


def _gaps(ascending: np.ndarray, end: int) -> np.ndarray:
    """How far each value of ``ascending`` is from the next (the last: from ``end``)."""
    gaps = np.empty_like(ascending)
    np.subtract(ascending[1:], ascending[:-1], out=gaps[:-1])
    gaps[-1] = end - ascending[-1]
    return gaps
