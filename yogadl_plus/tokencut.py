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
- positions and segments come from where the documents end inside each piece (the same
  search): the batch is cut into runs at each document start, and each run's positions and
  segment are one ``np.repeat`` over the runs.

Every step works on arrays the size of the batch (its pieces, its blocks, its tokens): nothing
loops over documents in Python, and the loops over pieces only slice. ``read(c)`` gives chunk
``c``'s column; its views may die at the next read, so the pieces are taken chunk by chunk
(each chunk read once), and only copies outlive a chunk: each chunk a batch touches costs a
read and a binary search (bench/bench_token_cut.py measures it all against Megatron's floor).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from yogadl_plus.cache.tokencolumns import TokenChunk

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

    @classmethod
    def empty(cls, blocks: int, length: int, dtype: np.dtype, segments: bool) -> Cut:
        """Arrays for ``blocks`` blocks of ``length`` tokens, not yet filled."""
        if not segments:
            return cls(np.empty((blocks, length), dtype), None, None)
        # One allocation for the three (each contiguous, the int64 first: aligned): fewer,
        # larger allocations keep the allocator's pages from being returned and taken again
        # batch after batch.
        size = blocks * length
        whole = np.empty(size * (8 + 4 + dtype.itemsize), np.uint8)
        position = whole[: 8 * size].view(np.int64).reshape(blocks, length)
        segment = whole[8 * size : 12 * size].view(np.int32).reshape(blocks, length)
        tokens = whole[12 * size :].view(dtype).reshape(blocks, length)
        return cls(tokens, position, segment)


def pieces(starts: np.ndarray, length: int, cum: np.ndarray) -> Pieces:
    """The flat ranges ``[starts[b], starts[b] + length)`` cut at the chunk boundaries ``cum``
    (int64, one more than the chunks: the flat tokens before each chunk, then the total)."""
    starts = np.asarray(starts, dtype=np.int64)
    stops = starts + length
    first = cum.searchsorted(starts, "right") - 1
    if (stops <= cum[first + 1]).all():  # (the usual case: every block inside one chunk)
        lo = starts - cum[first]
        return Pieces(np.arange(len(starts)), first, lo, lo + length, np.zeros_like(lo))
    last = cum.searchsorted(stops, "left") - 1
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
    out: Cut | None = None,
) -> Cut:
    """The blocks of ``length`` flat tokens beginning at ``starts`` (any order, repeats
    allowed; each block within ``cum[-1]``), read chunk by chunk through ``read``: one call per
    chunk the batch touches. Written into ``out`` where given (arrays of ``Cut.empty``'s shapes
    and dtypes, each row contiguous: they may be views into wider rows)."""
    into = out if out is not None else Cut.empty(len(starts), length, dtype, segments)
    if not len(starts):
        return into
    batch = _Batch(pieces(starts, length, cum), length, eos is not None, segments)
    for number, a, b in batch.groups:
        batch.add(read(number), a, b, into.tokens)
    if eos is not None:
        batch.fill(into.tokens, eos)
    if into.position is not None and into.segment is not None:
        batch.mark(into.position, into.segment)
    return into


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


def _by_chunk(chunks: list[int]) -> tuple[np.ndarray | None, list[tuple[int, int, int]]]:
    """An order of the pieces that puts each chunk's together (None: theirs already does),
    and the runs of that order, one per chunk the pieces touch: (chunk, a, b)."""
    order = None
    if any(a > b for a, b in itertools.pairwise(chunks)):
        order = np.argsort(chunks, kind="stable")
        chunks = [chunks[k] for k in order.tolist()]
    if chunks[0] == chunks[-1]:  # (the usual case when chunks are large: one chunk)
        return order, [(chunks[0], 0, len(chunks))]
    starts = [k for k in range(len(chunks)) if k == 0 or chunks[k] != chunks[k - 1]]
    return order, [(chunks[a], a, b) for a, b in itertools.pairwise([*starts, len(chunks)])]


class _Batch:
    """A batch's pieces, read one chunk at a time (views of a chunk die at the next read: all
    that is kept of it is copied), then put together by a few vectorized steps over the whole
    batch: no step loops over documents in Python, and the loops over pieces only slice.

    The pieces are taken in an order that puts each chunk's together (``order``; None where
    theirs does); ``fill`` lays their tokens end to end in that order, which is the batch's
    own where ``order`` is None."""

    def __init__(self, cut: Pieces, length: int, eos: bool, marks: bool) -> None:
        chunks = cut.chunk.tolist()
        order, self.groups = _by_chunk(chunks)
        self.cut = cut if order is None else Pieces(*(part[order] for part in cut))
        self.order, self.length, self.eos = order, length, eos
        self.searched = eos or marks  # (without either, a piece is one slice of tokens)
        self.done = np.empty((len(chunks), 2), np.int64)  # documents ended by lo, by hi
        self.firsts = np.empty(len(chunks), np.int64) if marks else None
        self.texts: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self._rows, self._columns = self.cut.row.tolist(), self.cut.column.tolist()
        self._bounds = np.empty((len(chunks), 2), np.int64)
        self._bounds[:, 0], self._bounds[:, 1] = self.cut.lo, self.cut.hi
        self._lo_hi = self._bounds.tolist()

    def add(self, chunk: TokenChunk, a: int, b: int, tokens: np.ndarray) -> None:
        """Pieces ``[a, b)`` (of this order), all of ``chunk``: without eos their tokens go
        straight to ``tokens`` (the batch's); with eos they are kept (one copy) for ``fill``;
        and where the chunk's documents end inside them, for ``fill`` and ``mark``."""
        lo_hi, source = self._lo_hi[a:b], chunk.tokens
        if not self.eos:
            for row, column, (lo, hi) in zip(self._rows[a:b], self._columns[a:b], lo_hi):
                tokens[row, column : column + hi - lo] = source[lo:hi]
        if not self.searched:
            return
        ends = chunk.eos_ends if self.eos else chunk.ends
        # The ends in (lo, hi] are those of the documents ending inside the piece.
        found = ends.searchsorted(self._bounds[a:b], "right")
        self.done[a:b] = found
        done = found.tolist()
        if self.eos:
            # Before flat position p of the chunk lie p - k tokens, k the documents ended by
            # then: the tokens of flat [lo, hi) are one slice.
            pieces = [source[lo - d : hi - e] for (lo, hi), (d, e) in zip(lo_hi, done)]
            self.texts.append(np.concatenate(pieces))
        self.ends.append(np.concatenate([ends[d:e] for d, e in done]))
        if self.firsts is not None:
            # How far into its document each piece begins.
            begins = [int(ends[d - 1]) if d else 0 for d, _ in done]
            self.firsts[a:b] = [lo - begin for (lo, _), begin in zip(lo_hi, begins)]

    def fill(self, tokens: np.ndarray, eos: int) -> None:
        """With eos: every piece's tokens where they go in ``tokens`` (B, L), ``eos`` after
        each document's last token."""
        cut = self.cut
        size = cut.hi - cut.lo
        # The eos of a document ending inside a piece: the flat token before its end.
        before = np.cumsum(size) - size - cut.lo - 1
        at = np.repeat(before, self.done[:, 1] - self.done[:, 0]) + self._all(self.ends)
        rest = np.ones(tokens.size, bool)
        rest[at] = False
        packed = tokens if self.order is None else np.empty_like(tokens)
        packed[...] = eos
        packed[rest.reshape(tokens.shape)] = self._all(self.texts)
        if self.order is None:  # (the pieces' order is the batch's: filled in place)
            return
        if len(size) == len(tokens):  # (each piece a whole block)
            tokens[cut.row] = packed
            return
        flat = packed.reshape(-1)
        for row, column, (lo, hi), at_ in zip(
            self._rows, self._columns, self._lo_hi, (before + cut.lo + 1).tolist()
        ):
            tokens[row, column : column + hi - lo] = flat[at_ : at_ + hi - lo]

    def mark(self, position: np.ndarray, segment: np.ndarray) -> None:
        """``position`` and ``segment`` (B, L): the batch cut into runs at each piece's first
        token and at each document start; positions count up along a run from its first
        token's (0 at a document start, else where its piece begins in its document),
        segments count the runs of a block after its first."""
        cut, length, firsts = self.cut, self.length, self.firsts
        assert firsts is not None  # (made for marks)
        blocks = len(position)
        at = cut.row * length + cut.column
        # A document starts where the one before it ends; one that starts at a block's end
        # is the next block's first token (position 0 there: no run of this block).
        starts = np.repeat(at - cut.lo, self.done[:, 1] - self.done[:, 0]) + self._all(self.ends)
        runs = np.concatenate([at, starts[starts % length != 0]])
        runs.sort()
        if not self.eos or len(at) > blocks:
            # Empty documents (without eos) start alike, as does a chunk's first with the
            # piece that begins there.
            fresh = np.ones(len(runs), bool)
            np.not_equal(runs[1:], runs[:-1], out=fresh[1:])
            runs = runs[fresh]
        base = np.zeros(len(runs), np.int64)
        base[runs.searchsorted(at)] = firsts
        sizes = _gaps(runs, blocks * length)
        shift = np.repeat(runs % length - base, sizes).reshape(blocks, length)
        np.subtract(np.arange(length, dtype=np.int64), shift, out=position)
        first_run = runs.searchsorted(np.arange(0, blocks * length, length, dtype=np.int64))
        counted = np.arange(len(runs), dtype=np.int32) - first_run[runs // length].astype(np.int32)
        segment[...] = np.repeat(counted, sizes).reshape(blocks, length)

    @staticmethod
    def _all(parts: list[np.ndarray]) -> np.ndarray:
        """``parts`` (one per chunk read) end to end."""
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _gaps(ascending: np.ndarray, end: int) -> np.ndarray:
    """How far each value of ``ascending`` is from the next (the last: from ``end``)."""
    gaps = np.empty_like(ascending)
    np.subtract(ascending[1:], ascending[:-1], out=gaps[:-1])
    gaps[-1] = end - ascending[-1]
    return gaps
