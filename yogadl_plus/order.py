"""The order of a data stream as a pure function ``(epoch, position) -> record index``.

Resuming, sharding and elastic rescaling are then arithmetic instead of replaying an iterator:
any position of any epoch costs the same to compute, in O(1) memory and with no I/O. A
shuffled epoch is a keyed pseudo-random bijection (a Feistel network with cycle-walking)
rather than a materialized ``np.random.permutation``, so a billion records need no
billion-entry array (up to 1024 records, where a table costs nothing, it is an exact keyed
Fisher-Yates shuffle), and the order is identical in every process because the keys come from
``hashlib.blake2b`` of the seed and epoch, never from Python's salted ``hash()``.

A windowed shuffle (``shuffle_window=W``, ``WindowPermutation``) permutes the chunks, then the
records within each window of ``W`` consecutive chunks of that permutation, with the same keyed
permutations: a reader works on about ``W`` chunks at a time, in O(chunks) memory per epoch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import operator
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from yogadl_plus.checks import check_bool, check_int
from yogadl_plus.splitmix import GOLDEN, MASK64, MIX_1, MIX_2, splitmix64, splitmix64_array

__all__ = [
    "ChunkShardOrder",
    "EpochOrder",
    "OrderSettings",
    "Permutation",
    "ShardOrder",
    "WindowPermutation",
]

_ROUNDS = 6
# Each Feistel round mixes with splitmix64's finalizer.
_SHIFT = 31
_C1_U64 = np.uint64(MIX_1)
_C2_U64 = np.uint64(MIX_2)
_SHIFT_U64 = np.uint64(_SHIFT)
_HALF_WORD_U64 = np.uint64(32)
_MAX_N = 1 << 63  # positions and record indices are int64
# Above this many positions, work in slices that stay in cache: the network is a long chain of
# cheap ufuncs, and streaming 8-byte temporaries through main memory would dominate.
_CHUNK = 8192
# Below this many stragglers, finish the cycle walk with Python ints: one numpy pass costs
# ~70 ufunc calls whatever the array size.
_SCALAR_TAIL = 8
# Up to this many records, an epoch's order is an exact keyed Fisher-Yates shuffle kept as a
# table: a Feistel network over a tiny domain reaches only some of the n! orders (n <= 6 is
# visibly non-uniform), and a table this small costs nothing.
_TABLE_MAX = 1024
# A windowed shuffle's windows use tables only this small: every shard makes the table of every
# window it reads from, so a table would cost each shard all the window's records, and S shards
# S times the epoch; the network costs each only its own positions.
_WINDOW_TABLE_MAX = 64
# Small windows' tables a WindowPermutation keeps: a block of positions straddles a few
# windows, and a table costs O(records) to make, so the next block must not remake it.
_WINDOWS_KEPT = 16


def _fisher_yates(n: int, key: int) -> npt.NDArray[np.int64]:
    """A uniformly random order of ``range(n)`` drawn from a splitmix64 stream seeded by
    ``key``: integer arithmetic only, so it is the same on every machine and numpy version."""
    table = list(range(n))
    draws = _draws_without_rejection(n, key)
    if draws is not None:
        for i, j in zip(range(n - 1, 0, -1), draws):
            table[i], table[j] = table[j], table[i]
        return np.array(table, dtype=np.int64)
    state = key
    for i in range(n - 1, 0, -1):
        bound = i + 1
        reject_below = (1 << 64) % bound  # Lemire: unbiased draws from [0, bound)
        while True:
            product = splitmix64(state) * bound
            state = (state + GOLDEN) & MASK64
            if product & MASK64 >= reject_below:
                break
        j = product >> 64
        table[i], table[j] = table[j], table[i]
    return np.array(table, dtype=np.int64)


def _draws_without_rejection(n: int, key: int) -> list[int] | None:
    """The swap targets ``_fisher_yates`` draws for ``range(n)``, all at once with numpy, or
    None if one draw of them is rejected (about once in 2**50 tables: the loop then draws).

    A windowed shuffle makes a table per small window, so the draws must not cost a Python
    loop of splitmix64 each; the result is the loop's, bit for bit.
    """
    if n < 2:
        return []
    assert n < 1 << 31  # the product's halves below stay inside 64 bits
    states = np.uint64(key) + np.arange(n - 1, dtype=np.uint64) * np.uint64(GOLDEN)
    bounds = np.arange(n, 1, -1, dtype=np.uint64)
    targets, low_word = _wide_product(splitmix64_array(states), bounds)
    reject_below = (np.uint64(MASK64) % bounds + np.uint64(1)) % bounds  # (2**64) % bound
    if (low_word < reject_below).any():
        return None
    return [int(j) for j in targets.tolist()]


def _wide_product(
    draws: npt.NDArray[np.uint64], bounds: npt.NDArray[np.uint64]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """The high and low 64-bit words of each 128-bit ``draw * bound``, for bounds below 2**31
    (numpy has no 128-bit integers: the draw is taken in 32-bit halves)."""
    high_part = (draws >> np.uint64(32)) * bounds
    low_part = (draws & np.uint64(0xFFFFFFFF)) * bounds
    high_word = (high_part + (low_part >> np.uint64(32))) >> np.uint64(32)
    low_word = (high_part << np.uint64(32)) + low_part  # wraps modulo 2**64, as it should
    return high_word, low_word


def _round_keys(seed: int, epoch: int) -> tuple[int, ...]:
    # Decimal text hashes any size of int the same way in every process and Python version.
    digest = hashlib.blake2b(
        f"{seed}:{epoch}".encode("ascii"), digest_size=8 * _ROUNDS, person=b"ydl-order-v1"
    ).digest()
    return tuple(int.from_bytes(digest[8 * i : 8 * i + 8], "little") for i in range(_ROUNDS))


def _range_message(position: int, n: int) -> str:
    if not n:
        return f"Got position {position}, but the permutation is empty (n=0)"
    return f"Got position {position}, allowed positions are in [0, {n - 1}]"


def _checked_positions(
    positions: npt.ArrayLike, n: int
) -> tuple[npt.NDArray[Any], npt.NDArray[np.uint64]]:
    """``positions`` as an array, and as a uint64 copy; TypeError unless they are integers,
    IndexError naming the first one outside ``[0, n)``."""
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu":
        if pos.size:
            raise TypeError(f"positions must be integers, got dtype {pos.dtype}")
        pos = pos.astype(np.int64)
    # Negative int64 wraps to huge uint64, so one comparison checks both ends of the range.
    work = pos.astype(np.uint64)
    out_of_range = work >= np.uint64(n)
    if out_of_range.any():
        bad = int(pos.reshape(-1)[np.flatnonzero(out_of_range)[0]])
        raise IndexError(_range_message(bad, n))
    return pos, work


def _side_of(n: int) -> int:
    """The side ``a = ceil(sqrt(n))`` of the network's square domain ``Z_a x Z_a`` for ``n``."""
    return math.isqrt(n - 1) + 1 if n > 1 else 1


def _feistel(
    values: npt.NDArray[np.uint64],
    side: np.uint64 | npt.NDArray[np.uint64],
    keys: Sequence[np.uint64 | npt.NDArray[np.uint64]],
) -> None:
    """One pass of the network with these round ``keys``, in place, over values in
    ``[0, side * side)``. ``side`` and each key are one number, or one per value (a windowed
    shuffle permutes many windows, each with its own network, in one pass)."""
    left = values // side
    right = values - left * side
    t = np.empty_like(values)
    u = np.empty_like(values)
    for i, key in enumerate(keys):
        src, dst = (right, left) if i % 2 == 0 else (left, right)
        np.bitwise_xor(src, key, out=t)
        np.multiply(t, _C1_U64, out=t)
        np.right_shift(t, _SHIFT_U64, out=u)
        np.bitwise_xor(t, u, out=t)
        np.multiply(t, _C2_U64, out=t)
        # Top 32 bits times a, top half of that: uniform in [0, a) without a division.
        np.right_shift(t, _HALF_WORD_U64, out=t)
        np.multiply(t, side, out=t)
        np.right_shift(t, _HALF_WORD_U64, out=t)
        # (dst + t) mod a for dst, t < a: subtracting a wraps to a huge uint64 when the
        # sum is already below a, so the minimum picks the right one.
        np.add(dst, t, out=dst)
        np.subtract(dst, side, out=u)
        np.minimum(dst, u, out=dst)
    np.multiply(left, side, out=left)
    np.add(left, right, out=values)


def _feistel_scalar(value: int, side: int, keys: Sequence[int]) -> int:
    """``_feistel`` of one value, with Python ints: for the last few values of a cycle walk,
    where a numpy pass would cost ~70 ufunc calls."""
    left, right = divmod(value, side)
    for i, key in enumerate(keys):
        src = right if i % 2 == 0 else left
        t = ((src ^ key) * MIX_1) & MASK64
        t ^= t >> _SHIFT
        t = ((((t * MIX_2) & MASK64) >> 32) * side) >> 32
        if i % 2 == 0:
            left = (left + t) % side
        else:
            right = (right + t) % side
    return left * side + right


class Permutation:
    """A keyed pseudo-random bijection of ``[0, n)``: ``p[position] -> index``.

    Fixed by ``(n, seed, epoch)`` alone, identical in every process. Construction and memory
    are O(1); ``indices`` evaluates many positions at once with numpy. Up to ``table_max``
    positions (1024 unless a windowed shuffle asks for fewer) the order is an exact keyed
    Fisher-Yates shuffle, kept as a table made on first use.
    """

    __slots__ = (
        "_keys",
        "_np_keys",
        "_side",
        "_table",
        "_table_max",
        "_walk_limit",
        "epoch",
        "n",
        "seed",
    )

    def __init__(self, n: int, seed: int, epoch: int = 0, *, table_max: int = _TABLE_MAX) -> None:
        self.n = check_int("n", n, 0, _MAX_N)
        self.seed = check_int("seed", seed, 0)
        self.epoch = check_int("epoch", epoch, 0)
        # Up to table_max positions the order is a keyed Fisher-Yates table (see _TABLE_MAX).
        self._table_max = check_int("table_max", table_max, 0, _TABLE_MAX)
        # A balanced Feistel network over Z_a x Z_a with a = ceil(sqrt(n)): the domain a * a
        # overshoots n by fewer than 2a values, so cycle-walking rarely needs a second pass.
        # (Halves of h bits would overshoot by up to 4x, and the walk would cost up to 4x.)
        self._side = _side_of(self.n)
        # A walk through a bijection reaches [0, n) within this many steps; more means a bug,
        # which had better raise than hang a data loader.
        self._walk_limit = self._side * self._side - self.n + 1
        self._keys = _round_keys(self.seed, self.epoch)
        self._np_keys = tuple(np.uint64(k) for k in self._keys)
        self._table: npt.NDArray[np.int64] | None = None  # made on first use, small n only

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Permutation(n={self.n}, seed={self.seed}, epoch={self.epoch})"

    def __getitem__(self, position: int) -> int:
        if isinstance(position, (bool, np.bool_)):
            raise TypeError(f"Permutation positions are ints, got the bool {position!r}")
        pos = operator.index(position)
        if not 0 <= pos < self.n:
            raise IndexError(_range_message(pos, self.n))
        if self.n <= self._table_max:
            return int(self._small_table()[pos])
        return self._walk_scalar(self._network_scalar(pos))

    def indices(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Returns the record index at each position, as int64 with the shape of ``positions``.

        Raises IndexError if a position is outside ``[0, n)``.
        """
        pos, work = _checked_positions(positions, self.n)
        return self._permute(work.reshape(-1)).reshape(pos.shape)

    def _small_table(self) -> npt.NDArray[np.int64]:
        if self._table is None:
            self._table = _fisher_yates(self.n, self._keys[0])
        return self._table

    def _permute(self, values: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Permutes in-range uint64 positions in place and returns them viewed as int64."""
        if self.n <= self._table_max:
            values[:] = self._small_table()[values.view(np.int64)]
            return values.view(np.int64)
        for begin in range(0, values.size, _CHUNK):
            self._permute_chunk(values[begin : begin + _CHUNK])
        return values.view(np.int64)

    def _permute_chunk(self, values: npt.NDArray[np.uint64]) -> None:
        n = np.uint64(self.n)
        self._network(values)
        pending = np.flatnonzero(values >= n)
        for _ in range(self._walk_limit):
            if pending.size <= _SCALAR_TAIL:
                break
            walked = values[pending]
            self._network(walked)
            values[pending] = walked
            pending = pending[walked >= n]
        for i in pending.tolist():
            values[i] = self._walk_scalar(int(values[i]))

    def _walk_scalar(self, value: int) -> int:
        for _ in range(self._walk_limit):
            if value < self.n:
                return value
            value = self._network_scalar(value)
        raise RuntimeError(f"{self!r}: cycle-walking did not end; the network is not a bijection")

    def _network(self, values: npt.NDArray[np.uint64]) -> None:
        """One pass of the network, in place, over values in ``[0, a * a)``.

        Must equal ``_network_scalar`` value for value.
        """
        _feistel(values, np.uint64(self._side), self._np_keys)

    def _network_scalar(self, value: int) -> int:
        return _feistel_scalar(value, self._side, self._keys)


def _window_keys(seed: int, epoch: int, window: int) -> tuple[int, ...]:
    """A windowed epoch's keys: the chunk permutation's seed, then the base of each round's
    window keys. Their own BLAKE2b domain, so none is a full shuffle's key."""
    digest = hashlib.blake2b(
        f"{seed}:{epoch}:{window}".encode("ascii"),
        digest_size=8 * (_ROUNDS + 1),
        person=b"ydl-window-v1",
    ).digest()
    return tuple(int.from_bytes(digest[8 * i : 8 * i + 8], "little") for i in range(_ROUNDS + 1))


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
        pos, work = _checked_positions(positions, self.n)
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
        if isinstance(position, (bool, np.bool_)):
            raise TypeError(f"Permutation positions are ints, got the bool {position!r}")
        pos = operator.index(position)
        if not 0 <= pos < self.n:
            raise IndexError(_range_message(pos, self.n))
        return int(self._permute(np.array([pos], dtype=np.uint64))[0])

    def indices(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Returns the index at each position, as int64 with the shape of ``positions``.

        Raises IndexError if a position is outside ``[0, n)``.
        """
        pos, work = _checked_positions(positions, self.n)
        return self._permute(work.reshape(-1)).reshape(pos.shape)

    def _permute(self, values: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Permutes in-range uint64 positions in place and returns them viewed as int64."""
        for begin in range(0, values.size, _CHUNK):
            self._permute_chunk(values[begin : begin + _CHUNK].view(np.int64))
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
        _walk(work, np.uint64(size), np.uint64(_side_of(size)), tuple(key[0] for key in keys))

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
        sides = np.array([_side_of(int(size)) for size in sizes.tolist()], dtype=np.uint64)
        at = which[big]
        work = local[big].view(np.uint64)
        _walk(work, sizes.astype(np.uint64)[at], sides[at], tuple(key[at] for key in keys))
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
            found = _fisher_yates(size, key)
            # Replaced, never changed in place: a concurrent reader sees the old dict or the new.
            recent = list(self._windows.items())[-(_WINDOWS_KEPT - 1) :]
            self._windows = {**dict(recent), k: found}
        return found


def _walk(
    values: npt.NDArray[np.uint64],
    n: np.uint64 | npt.NDArray[np.uint64],
    side: np.uint64 | npt.NDArray[np.uint64],
    keys: tuple[np.uint64 | npt.NDArray[np.uint64], ...],
) -> None:
    """Passes ``values`` through the network (``side``, ``keys``) in place, again and again
    for those still outside ``[0, n)``: ``Permutation``'s network with cycle-walking, where
    ``n``, ``side`` and the keys may differ value by value."""

    def each(x: Any, at: Any) -> Any:
        return x[at] if isinstance(x, np.ndarray) else x

    _feistel(values, side, keys)
    pending = np.flatnonzero(values >= n)
    # A walk through a bijection of [0, side * side) reaches [0, n) within side * side - n + 1
    # steps; more means a bug, which had better raise than hang a data loader.
    limit = int(np.max(np.asarray(side) * np.asarray(side) - np.asarray(n))) + 1
    for _ in range(limit):
        if pending.size <= _SCALAR_TAIL:
            break
        walked = values[pending]
        _feistel(walked, each(side, pending), tuple(each(key, pending) for key in keys))
        values[pending] = walked
        pending = pending[walked >= each(n, pending)]
    for i in pending.tolist():
        value, steps = int(values[i]), 0
        size, width = int(each(n, i)), int(each(side, i))
        round_keys = [int(each(key, i)) for key in keys]
        while value >= size:
            value = _feistel_scalar(value, width, round_keys)
            steps += 1
            if steps > limit:
                raise RuntimeError("cycle-walking did not end; the network is not a bijection")
        values[i] = value


SHARD_BY = ("records", "chunks")


@dataclass(frozen=True)
class OrderSettings:
    """How a stream orders its records: shuffle, shards, and where it starts; checked once, here.

    ``seed`` may be None with ``shuffle=True`` on one shard (the stream draws one: ``seeded``);
    ``start_offset`` counts this shard's positions from the first epoch, ``global_start`` is
    the elastic resume point (``shard_by="records"`` only). See docs/streams.md.

    ``shuffle_window=W`` (with ``shuffle=True`` only) makes each epoch a ``WindowPermutation``
    of the positions grouped by chunk instead of a full ``Permutation``: see
    docs/windowed-shuffle.md. It holds with every other setting: with
    ``skip_shuffle_at_epoch_end`` every epoch reuses epoch 0's windowed order; with
    ``shard_by="chunks"`` each shard shuffles its own chunks in windows of W of them; with
    n-grams the positions (anchors) are grouped by the chunk of their anchor record.
    """

    shuffle: bool = False
    seed: int | None = None
    skip_shuffle_at_epoch_end: bool = False
    shard_rank: int = 0
    num_shards: int = 1
    drop_shard_remainder: bool = False
    shard_by: str = "records"
    start_offset: int = 0
    global_start: int | None = None
    shuffle_window: int | None = None

    def __post_init__(self) -> None:
        def keep(name: str, value: object) -> None:
            object.__setattr__(self, name, value)  # normalized (np.int64 -> int): frozen

        keep("start_offset", check_int("start_offset", self.start_offset, 0))
        if self.global_start is not None:
            keep("global_start", check_int("global_start", self.global_start, 0))
        keep("shuffle", check_bool("shuffle", self.shuffle))
        keep(
            "skip_shuffle_at_epoch_end",
            check_bool("skip_shuffle_at_epoch_end", self.skip_shuffle_at_epoch_end),
        )
        keep("drop_shard_remainder", check_bool("drop_shard_remainder", self.drop_shard_remainder))
        keep("num_shards", check_int("num_shards", self.num_shards, 1))
        keep("shard_rank", check_int("shard_rank", self.shard_rank, 0, self.num_shards - 1))
        if self.seed is not None:
            keep("seed", check_int("seed", self.seed, 0))
        elif self.shuffle and self.num_shards != 1:
            raise ValueError(
                "shuffle=True with num_shards > 1 needs an explicit shuffle_seed, shared by "
                "all ranks; otherwise each rank would draw its own and the shards would overlap"
            )
        if self.shard_by not in SHARD_BY:
            raise ValueError(f"shard_by must be 'records' or 'chunks', got {self.shard_by!r}")
        if self.shard_by == "chunks" and self.global_start is not None:
            raise ValueError(CHUNK_SHARDS_TAKE_NO_GLOBAL_ORDER)
        if self.shuffle_window is not None:
            keep("shuffle_window", check_int("shuffle_window", self.shuffle_window, 1))
            if not self.shuffle:
                raise ValueError(
                    f"shuffle_window={self.shuffle_window} shuffles within windows of chunks: "
                    "it needs shuffle=True (or leave shuffle_window=None)"
                )

    def seeded(self) -> OrderSettings:
        """These settings, with a freshly drawn seed if they shuffle without one."""
        if self.shuffle and self.seed is None:
            return dataclasses.replace(self, seed=secrets.randbits(63))
        return self

    def order(
        self, num_positions: int, chunk_records: Sequence[int] | npt.NDArray[np.int64]
    ) -> ShardOrder:
        """The order of ``num_positions`` positions (records, or n-gram windows) by these
        settings: an EpochOrder, or a ChunkShardOrder over chunks of ``chunk_records`` records.

        ``chunk_records`` counts the positions of each chunk (records; for n-grams, the anchors
        whose anchor record lies in it): the windows of ``shuffle_window`` group them."""
        if self.shard_by == "chunks":
            return ChunkShardOrder(chunk_records, self)
        return EpochOrder(num_positions, self, chunk_records=chunk_records)


CHUNK_SHARDS_TAKE_NO_GLOBAL_ORDER = (
    "shard_by='chunks' shards whole chunks of records: it takes neither ngram= nor "
    "global_start= (use shard_by='records' for those)"
)


def _settings_or(
    settings: OrderSettings | None, options: dict[str, Any], **defaults: Any
) -> OrderSettings:
    """The settings an order is made with: given whole, or as OrderSettings' keywords (over
    ``defaults``)."""
    if settings is None:
        return OrderSettings(**{**defaults, **options})
    if options:
        raise TypeError(f"pass OrderSettings or keywords, not both: got {sorted(options)}")
    return settings


class ShardOrder:
    """The record order of one shard of a stream, epoch by epoch, as a pure function.

    Each epoch has one order over all ``num_records`` records: the identity, or with
    ``shuffle=True`` the ``Permutation(num_records, seed, epoch)`` (epoch 0's for every epoch
    with ``skip_shuffle_at_epoch_end=True``). ``drop_shard_remainder=True`` first cuts that order
    to its first ``global_length`` positions, a multiple of ``num_shards``. Shard ``r`` of ``S``
    takes positions ``r, r + S, r + 2S, ...``, so within an epoch the shards are disjoint and
    together cover the (cut) order. Any ``(epoch, position)`` costs the same.

    ``global_start = g`` starts in epoch ``g // num_records`` at position ``g % num_records``:
    in that first epoch, shard ``r`` takes positions ``g0 + r, g0 + r + S, ...``, cut with
    ``drop_shard_remainder`` to a multiple of ``S`` after ``g0``; later epochs are whole.

    With ``shuffle_window=W`` the epoch's order is a ``WindowPermutation`` of the records
    grouped by ``chunk_records`` (records per chunk, summing to ``num_records``); the rest of
    the arithmetic is the same.

    Made from ``OrderSettings`` (or its keywords: ``EpochOrder(10, shuffle=True, seed=1)``).
    """

    def __init__(
        self,
        num_records: int,
        settings: OrderSettings | None = None,
        *,
        chunk_records: Sequence[int] | npt.ArrayLike | None = None,
        **options: Any,
    ) -> None:
        settings = _settings_or(settings, options)
        if settings.shuffle and settings.seed is None:
            raise ValueError(
                "shuffle=True needs a seed, got seed=None: pass shuffle_seed; the Stream "
                "draws one when none is given"
            )
        self.settings = settings
        self.num_records = check_int("num_records", num_records, 0, _MAX_N)
        self.global_start = settings.global_start or 0
        self.shuffle = settings.shuffle
        self.seed = settings.seed
        self.skip_shuffle_at_epoch_end = settings.skip_shuffle_at_epoch_end
        self.drop_shard_remainder = settings.drop_shard_remainder
        self.num_shards = settings.num_shards
        self.shard_rank = settings.shard_rank

        self.shuffle_window = settings.shuffle_window
        self._chunk_records = _chunk_counts(chunk_records, self.num_records, self.shuffle_window)

        n, shards = self.num_records, self.num_shards
        self.global_length = n - n % shards if self.drop_shard_remainder else n
        self.shard_length = len(range(self.shard_rank, self.global_length, shards))
        self.first_epoch, self.first_global = divmod(self.global_start, n) if n else (0, 0)
        self._perm: Permutation | WindowPermutation | None = None

    def epoch_start(self, epoch: int) -> int:
        """The global position where ``epoch`` starts: ``global_start``'s in the first epoch."""
        if epoch < self.first_epoch:
            raise ValueError(
                f"epoch {epoch} comes before this order's first epoch {self.first_epoch} "
                f"(global_start={self.global_start})"
            )
        return self.first_global if epoch == self.first_epoch else 0

    def epoch_global_length(self, epoch: int) -> int:
        """The end of ``epoch``'s global order (cut to whole rounds of shards after its start)."""
        start = self.epoch_start(epoch)
        if not start:
            return self.global_length
        if self.drop_shard_remainder:
            return start + (self.num_records - start) // self.num_shards * self.num_shards
        return self.num_records

    def epoch_shard_length(self, epoch: int) -> int:
        """Positions of this shard in ``epoch`` (fewer in a first epoch begun mid-way)."""
        start = self.epoch_start(epoch)
        if not start:
            return self.shard_length
        return len(range(start + self.shard_rank, self.epoch_global_length(epoch), self.num_shards))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_records={self.num_records}, shuffle={self.shuffle}, "
            f"seed={self.seed}, skip_shuffle_at_epoch_end={self.skip_shuffle_at_epoch_end}, "
            f"shard_rank={self.shard_rank}, num_shards={self.num_shards}, "
            f"drop_shard_remainder={self.drop_shard_remainder}, global_start={self.global_start}"
            f"{_window_repr(self.shuffle_window)})"
        )

    def locate(self, offset: int) -> tuple[int, int]:
        """(epoch, position) of this shard's ``offset``-th position, counted from the first
        epoch's start."""
        first = self.first_epoch
        first_length = self.epoch_shard_length(first)
        # Offset 0 is the first epoch even when this shard has nothing left in it (a resumed
        # epoch can be empty for some shards): its first iteration must still be that epoch.
        if offset < first_length or offset == 0 or not self.shard_length:
            return first, min(offset, first_length)
        epochs, position = divmod(offset - first_length, self.shard_length)
        return first + 1 + epochs, position

    def offset_of(self, epoch: int, position: int) -> int:
        """The offset (``locate``'s inverse) of this shard's ``position`` in ``epoch``."""
        first = self.first_epoch
        if epoch == first:
            return position
        return self.epoch_shard_length(first) + (epoch - first - 1) * self.shard_length + position

    def global_position(self, position: int) -> int:
        """Returns where this shard's ``position`` sits in a whole epoch's global order (in the
        first epoch of a ``global_start`` order, add ``epoch_start(epoch)``)."""
        position = check_int("position", position, 0)
        return self.shard_rank + self.num_shards * position

    def indices(self, epoch: int, start: int, stop: int) -> npt.NDArray[np.int64]:
        """Returns the int64 record indices at positions ``[start, stop)`` of this shard's epoch.

        ``start`` and ``stop`` are clipped to ``[0, shard_length]``; the work is O(stop - start)
        for any epoch and position.
        """
        epoch = check_int("epoch", epoch, 0)
        length = self.epoch_shard_length(epoch)
        start = min(max(operator.index(start), 0), length)
        stop = min(max(operator.index(stop), start), length)
        positions = np.arange(start, stop, dtype=np.int64)
        positions *= self.num_shards
        positions += self.shard_rank + self.epoch_start(epoch)
        perm = self._permutation(epoch)
        return positions if perm is None else perm._permute(positions.view(np.uint64))

    def index(self, epoch: int, position: int) -> int:
        """Returns the record index at this shard's ``position`` of ``epoch``."""
        epoch = check_int("epoch", epoch, 0)
        position = operator.index(position)
        length = self.epoch_shard_length(epoch)
        if not 0 <= position < length:
            raise IndexError(
                f"Got position {position}, allowed positions are in [0, {length - 1}]"
                if length
                else f"Got position {position}, but this shard has no positions"
            )
        global_position = self.epoch_start(epoch) + self.shard_rank + self.num_shards * position
        perm = self._permutation(epoch)
        return global_position if perm is None else perm[global_position]

    def _permutation(self, epoch: int) -> Permutation | WindowPermutation | None:
        if not self.shuffle:
            return None
        assert self.seed is not None
        key_epoch = 0 if self.skip_shuffle_at_epoch_end else epoch
        perm = self._perm  # one read, so a concurrent caller can only replace it
        if perm is None or perm.epoch != key_epoch:
            if self.shuffle_window is None:
                perm = Permutation(self.num_records, self.seed, key_epoch)
            else:
                assert self._chunk_records is not None
                perm = WindowPermutation(
                    self._chunk_records, self.shuffle_window, self.seed, key_epoch
                )
            self._perm = perm
        return perm

    def window_permutation(self, epoch: int) -> WindowPermutation | None:
        """The windowed permutation of ``epoch``'s global order (its chunk order and windows,
        for a reader that fetches chunks ahead), or None without ``shuffle_window``."""
        perm = self._permutation(check_int("epoch", epoch, 0))
        return perm if isinstance(perm, WindowPermutation) else None


def _chunk_counts(
    chunk_records: Sequence[int] | npt.ArrayLike | None, num_records: int, window: int | None
) -> npt.NDArray[np.int64] | None:
    """The positions per chunk as int64, checked to add up to ``num_records``: only a windowed
    shuffle needs (and checks) them."""
    if window is None:
        return None
    if chunk_records is None:
        raise ValueError(
            "shuffle_window needs the records of each chunk: pass chunk_records (the Stream "
            "passes its version's)"
        )
    counts = np.asarray(chunk_records)
    if counts.ndim != 1 or (counts.size and counts.dtype.kind not in "iu"):
        raise ValueError(f"chunk_records must be a 1-d sequence of ints, got {chunk_records!r}")
    counts = counts.astype(np.int64)
    if (counts.size and counts.min() < 0) or int(counts.sum()) != num_records:
        raise ValueError(
            f"chunk_records must be counts >= 0 adding up to num_records={num_records}, got "
            f"{len(counts)} chunks adding up to {int(counts.sum())}"
        )
    return counts


def _window_repr(window: int | None) -> str:
    # Orders without a window print as they did before windows existed: a Keras backup made
    # then names its order by this repr.
    return "" if window is None else f", shuffle_window={window}"


class EpochOrder(ShardOrder):
    """A ShardOrder over one global order of the records, which every shard strides through:
    ``global_offset`` maps a shard's place to the ``global_start`` that resumes there on any
    number of shards (elastic resume)."""

    def global_offset(self, epoch: int, position: int) -> int:
        """The global position, counted from epoch 0, reached when every shard has handed out
        ``position`` items of ``epoch``: what ``global_start`` takes to resume there."""
        reached = self.epoch_start(epoch) + self.num_shards * position
        if reached >= self.epoch_global_length(epoch):
            return (epoch + 1) * self.num_records
        return epoch * self.num_records + reached


class ChunkShardOrder(ShardOrder):
    """The order of a shard made of whole chunks: shard ``r`` of ``S`` owns chunks
    ``r, r + S, r + 2S, ...`` and shuffles only among their records.

    A rank then reads (and pulls from a remote store) only its own chunks, at the price of a
    shuffle that never mixes records across shards. ``drop_shard_remainder=True`` cuts every
    shard to the shortest one's length, so all shards have as many positions. There is no global
    order, so no ``global_start`` and no ``global_offset``: resume with ``start_offset`` on the
    same number of shards.
    """

    def __init__(
        self,
        chunk_records: Sequence[int] | npt.NDArray[np.int64],
        settings: OrderSettings | None = None,
        **options: Any,
    ) -> None:
        settings = _settings_or(settings, options, shard_by="chunks")
        num_shards, shard_rank = settings.num_shards, settings.shard_rank
        counts = np.asarray(chunk_records, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        if len(counts) < num_shards:
            raise ValueError(
                f"shard_by='chunks' needs at least one chunk per shard: this version has "
                f"{len(counts)} chunks for num_shards={num_shards}; build it with a smaller "
                "chunk_bytes, or shard by records"
            )
        mine = np.arange(shard_rank, len(counts), num_shards)
        self._starts = starts[mine]  # where each of this shard's chunks starts in the version
        self._ends = np.cumsum(counts[mine])  # ... and ends in this shard's own numbering
        self._local_starts = self._ends - counts[mine]
        # Within its chunks, the shard is the one shard of an order of their records (a
        # windowed shuffle then windows this shard's chunks).
        whole = dataclasses.replace(
            settings, shard_rank=0, num_shards=1, drop_shard_remainder=False, global_start=None
        )
        super().__init__(int(self._ends[-1]), whole, chunk_records=counts[mine])
        self.settings = settings
        self.chunks = mine
        self.chunk_shard = (shard_rank, num_shards)
        self.drop_shard_remainder = settings.drop_shard_remainder
        if self.drop_shard_remainder:
            # Each epoch takes the first `shortest` positions of this shard's own shuffle: a
            # different cut every shuffled epoch, as with shard_by="records".
            shortest = min(int(counts[r::num_shards].sum()) for r in range(num_shards))
            self.global_length = self.shard_length = shortest

    def _records(self, local: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """This shard's k-th record -> the version's record index."""
        chunk = np.searchsorted(self._ends, local, side="right")
        return self._starts[chunk] + (local - self._local_starts[chunk])

    def indices(self, epoch: int, start: int, stop: int) -> npt.NDArray[np.int64]:
        return self._records(super().indices(epoch, start, stop))

    def index(self, epoch: int, position: int) -> int:
        return int(self._records(np.array([super().index(epoch, position)], dtype=np.int64))[0])

    def __repr__(self) -> str:
        rank, shards = self.chunk_shard
        return (
            f"ChunkShardOrder(chunks={len(self.chunks)}, records={self.num_records}, "
            f"shuffle={self.shuffle}, seed={self.seed}, shard_rank={rank}, num_shards={shards}, "
            f"drop_shard_remainder={self.drop_shard_remainder}{_window_repr(self.shuffle_window)})"
        )
