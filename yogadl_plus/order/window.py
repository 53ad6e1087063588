"""A keyed shuffle that keeps a reader on a window of chunks at a time: ``shuffle_window=W``.

The chunks are put in a keyed order, and the records of each window of ``W`` consecutive chunks
of that order are shuffled among themselves, with the one keyed shuffle of permutation.py (its
keys of their own). A reader then works on about ``W`` chunks at a time, in O(chunks) memory per
epoch, and the order stays a pure function of (seed, epoch, position): see
docs/windowed-shuffle.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from yogadl_plus.checks import check_int
from yogadl_plus.order.permutation import (
    BLOCK,
    ROUNDS,
    Permutation,
    checked_position,
    checked_positions,
    cycle_walk,
    fisher_yates,
    hashed_words,
    side_of,
)
from yogadl_plus.splitmix import GOLDEN, splitmix64_array

__all__ = ["WindowPermutation"]

# A windowed shuffle's windows use tables only this small: every shard makes the table of every
# window it reads from, so a table would cost each shard all the window's records, and S shards
# S times the epoch; the network costs each only its own positions.
_WINDOW_TABLE_MAX = 64
# Small windows' tables a WindowPermutation keeps: a block of positions straddles a few
# windows, and a table costs O(records) to make, so the next block must not remake it.
_WINDOWS_KEPT = 16


def _window_keys(seed: int, epoch: int, window: int) -> tuple[int, ...]:
    """A windowed epoch's keys: the chunk permutation's seed, then the base of each round's
    window keys. Their own BLAKE2b domain, so none is a full shuffle's key."""
    return hashed_words(f"{seed}:{epoch}:{window}", ROUNDS + 1, b"ydl-window-v1")


class WindowPermutation:
    """A keyed bijection of ``[0, n)`` that keeps a reader on ``window`` chunks at a time.

    The positions are grouped in chunks of ``chunk_records[c]`` positions each (a version's
    chunks, in storage order). Epoch ``epoch`` puts the chunks in the order of a
    ``Permutation`` keyed by ``(seed, epoch, window)``; each ``window`` consecutive chunks of
    that order form a window (the last one, the chunks left over), and the positions of a
    window are those of its chunks, in the order of the window's own keyed bijection: the
    network ``Permutation`` uses (a Fisher-Yates table up to 64 records only, so that a shard
    pays for its own positions, not for whole windows' tables), keyed by splitmix64 of the
    epoch's keys and the window's number. So ``p[position] -> index`` where every index of a
    window comes from that window's chunks, and window ``k``'s positions all come before
    window ``k + 1``'s.

    Fixed by ``(chunk_records, window, seed, epoch)`` alone, identical in every process. Memory
    is O(number of chunks) and never O(n); ``indices`` evaluates many positions at once.
    """

    __slots__ = (
        "_base_keys",
        "_chunk_first",
        "_placed_ends",
        "_placed_starts",
        "_window_sizes",
        "_window_starts",
        "_windows",
        "chunk_order",
        "epoch",
        "n",
        "seed",
        "window",
    )

    def __init__(
        self, chunk_records: Sequence[int] | npt.ArrayLike, window: int, seed: int, epoch: int = 0
    ) -> None:
        counts = np.asarray(chunk_records)
        if counts.ndim != 1 or (counts.size and counts.dtype.kind not in "iu"):
            raise ValueError(
                f"chunk_records must be a 1-d sequence of ints, got {counts.dtype} with shape "
                f"{counts.shape}"
            )
        counts = counts.astype(np.int64)
        if counts.size and counts.min() < 0:
            raise ValueError(f"chunk_records must be >= 0, got {int(counts.min())}")
        self.window = check_int("window", window, 1)
        self.seed = check_int("seed", seed, 0)
        self.epoch = check_int("epoch", epoch, 0)
        self.n = int(counts.sum())
        starts = np.cumsum(counts) - counts  # where each chunk starts in storage order
        chunk_seed, *self._base_keys = _window_keys(self.seed, self.epoch, self.window)
        chunks = Permutation(len(counts), chunk_seed)
        #: The chunks in this epoch's order (chunk numbers of ``chunk_records``).
        self.chunk_order = chunks.indices(np.arange(len(counts), dtype=np.int64))
        self.chunk_order.flags.writeable = False
        placed = counts[self.chunk_order]
        self._placed_ends = np.cumsum(placed)  # where each placed chunk ends in the epoch
        self._placed_starts = self._placed_ends - placed
        self._chunk_first = starts[self.chunk_order]
        self._window_starts = self._placed_starts[:: self.window]
        self._window_sizes = np.diff(np.append(self._window_starts, self.n))
        self._windows: dict[int, npt.NDArray[np.int64]] = {}  # recent small windows' tables

    @property
    def num_windows(self) -> int:
        """Windows in the epoch: ``ceil(chunks / window)`` (empty chunks count as chunks)."""
        return len(self._window_starts)

    def window_chunks(self, k: int) -> npt.NDArray[np.int64]:
        """The chunks of window ``k``, in the epoch's order: what a reader needs while the
        epoch is in that window (and can fetch before it gets there)."""
        k = check_int("k", k, 0, max(self.num_windows - 1, 0))
        return self.chunk_order[k * self.window : (k + 1) * self.window]

    def window_of(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The window each position falls in, with the shape of ``positions``."""
        pos, work = checked_positions(positions, self.n)
        found = np.searchsorted(self._window_starts, work.view(np.int64), side="right") - 1
        return found.reshape(pos.shape)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return (
            f"WindowPermutation(chunks={len(self.chunk_order)}, n={self.n}, "
            f"window={self.window}, seed={self.seed}, epoch={self.epoch})"
        )

    def __getitem__(self, position: int) -> int:
        pos = checked_position(position, self.n)
        return int(self.permute(np.array([pos], dtype=np.uint64))[0])

    def indices(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Returns the index at each position, as int64 with the shape of ``positions``.

        Raises IndexError if a position is outside ``[0, n)``.
        """
        pos, work = checked_positions(positions, self.n)
        return self.permute(work.reshape(-1)).reshape(pos.shape)

    def permute(self, values: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Permutes in-range uint64 positions in place and returns them viewed as int64 (the
        unchecked ``indices``, for orders that made the positions themselves)."""
        for begin in range(0, values.size, BLOCK):
            self._permute_chunk(values[begin : begin + BLOCK].view(np.int64))
        return values.view(np.int64)

    def _permute_chunk(self, out: npt.NDArray[np.int64]) -> None:
        if not out.size:
            return
        starts = self._window_starts
        lowest, highest = np.searchsorted(starts, [out.min(), out.max()], side="right") - 1
        if lowest == highest:
            # The usual block: all in one window, whose few chunks are searched alone.
            k = int(lowest)
            placed = out - starts[k]
            self._permute_in_window(placed, k)
            placed += starts[k]
            ends = self._placed_ends[k * self.window : (k + 1) * self.window]
            slot = k * self.window + np.searchsorted(ends, placed, side="right")
        else:
            window = np.searchsorted(starts, out, side="right") - 1
            placed = out - starts[window]
            self._permute_in_windows(placed, window)
            placed += starts[window]  # the place in the epoch's run of chunks
            slot = np.searchsorted(self._placed_ends, placed, side="right")
        out[:] = self._chunk_first[slot] + (placed - self._placed_starts[slot])

    def _permute_in_window(self, local: npt.NDArray[np.int64], k: int) -> None:
        """Permutes offsets in window ``k``, in place, by the window's own permutation."""
        size = int(self._window_sizes[k])
        keys = self._round_keys(np.array([k], dtype=np.uint64))
        if size <= _WINDOW_TABLE_MAX:
            local[:] = self._table(k, size, int(keys[0][0]))[local]
            return
        work = local.view(np.uint64)
        cycle_walk(work, np.uint64(size), np.uint64(side_of(size)), tuple(key[0] for key in keys))

    def _permute_in_windows(self, local: npt.NDArray[np.int64], window: np.ndarray) -> None:
        """Permutes offsets, each in its own window, in place: the networks of all the
        windows in one pass, so a shard that takes a few positions of each of many windows
        pays per position, not per window."""
        windows, which = np.unique(window, return_inverse=True)
        sizes = self._window_sizes[windows]
        keys = self._round_keys(windows.astype(np.uint64))
        small = sizes <= _WINDOW_TABLE_MAX
        for i in np.flatnonzero(small).tolist():
            mine = np.flatnonzero(which == i)
            table = self._table(int(windows[i]), int(sizes[i]), int(keys[0][i]))
            local[mine] = table[local[mine]]
        big = np.flatnonzero(~small[which])
        if not big.size:
            return
        sides = np.array([side_of(int(size)) for size in sizes.tolist()], dtype=np.uint64)
        at = which[big]
        work = local[big].view(np.uint64)
        cycle_walk(work, sizes.astype(np.uint64)[at], sides[at], tuple(key[at] for key in keys))
        local[big] = work.view(np.int64)

    def _round_keys(self, windows: npt.NDArray[np.uint64]) -> list[npt.NDArray[np.uint64]]:
        """Each round's key for each of ``windows``: output k of a splitmix64 stream seeded by
        the round's base key, so a block's windows get their keys in one numpy step."""
        steps = windows * np.uint64(GOLDEN)
        return [splitmix64_array(np.uint64(base) + steps) for base in self._base_keys]

    def _table(self, k: int, size: int, key: int) -> npt.NDArray[np.int64]:
        """Window ``k``'s order when it is small: a keyed Fisher-Yates table, as
        ``Permutation`` makes for small orders."""
        found = self._windows.get(k)
        if found is None:
            found = fisher_yates(size, key)
            # Replaced, never changed in place: a concurrent reader sees the old dict or the new.
            recent = list(self._windows.items())[-(_WINDOWS_KEPT - 1) :]
            self._windows = {**dict(recent), k: found}
        return found
