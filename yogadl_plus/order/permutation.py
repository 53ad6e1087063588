"""The one keyed shuffle: a pseudo-random bijection of ``[0, n)`` fixed by a key, in O(1) memory.

Above ``TABLE_MAX`` positions it is a balanced Feistel network over ``Z_a x Z_a`` (``a =
ceil(sqrt(n))``) with cycle-walking, evaluated with numpy for many positions at once; up to it, an
exact keyed Fisher-Yates shuffle kept as a table (a network over a tiny domain reaches only some
of the n! orders). Both are driven by splitmix64 (integer arithmetic only, the same bits on
every machine and numpy version) and keyed by BLAKE2b of the seed and epoch, never by Python's
salted ``hash()``, so an order is the same in every process.

Every order of the package is made of these pieces: ``Permutation`` for an epoch of records
and for each source of a mixture, ``WindowPermutation`` (window.py) for the chunks and the
windows of a windowed shuffle, with keys of their own.
"""

from __future__ import annotations

import array
import hashlib
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from yogadl_plus.checks import check_int
from yogadl_plus.splitmix import GOLDEN, MASK64, MIX_1, MIX_2, splitmix64, splitmix64_array

__all__ = [
    "ROUNDS",
    "TABLE_MAX",
    "Permutation",
    "checked_positions",
    "cycle_walk",
    "fisher_yates",
    "hashed_words",
    "side_of",
]

ROUNDS = 6
# Each Feistel round mixes with splitmix64's finalizer.
_SHIFT = 31
_C1_U64 = np.uint64(MIX_1)
_C2_U64 = np.uint64(MIX_2)
_SHIFT_U64 = np.uint64(_SHIFT)
_HALF_WORD_U64 = np.uint64(32)
_MAX_N = 1 << 63  # positions and record indices are int64
# Above this many positions, work in slices that stay in cache: the network is a long chain of
# cheap ufuncs, and streaming 8-byte temporaries through main memory would dominate. Each slice
# costs about 60 us of calls, though: 300,000 positions took 9.0 ms in slices of 8192, 7.0 ms
# in slices of 32768 (five arrays of 256 KiB), 10.8 ms in slices of 131072.
BLOCK = 32768
# Below this many stragglers, finish the cycle walk with Python ints: one numpy pass costs
# ~70 ufunc calls whatever the array size.
_SCALAR_TAIL = 8
#: Up to this many records, an order is an exact keyed Fisher-Yates shuffle kept as a table: a
#: Feistel network over a tiny domain reaches only some of the n! orders (n <= 6 is visibly
#: non-uniform), and a table this small costs nothing.
TABLE_MAX = 1024
# From this many tables of one size on, their swaps are made together with numpy.
_ROWS_TOGETHER = 32

U64 = npt.NDArray[np.uint64]
Keys = Sequence[np.uint64 | U64]


# --- keys ---


def hashed_words(text: str, count: int, person: bytes) -> tuple[int, ...]:
    """``count`` 64-bit words from BLAKE2b of ``text`` in the domain ``person``: keys that are the
    same in every process and Python version (decimal text hashes any size of int alike)."""
    digest = hashlib.blake2b(text.encode(), digest_size=8 * count, person=person).digest()
    return tuple(int.from_bytes(digest[8 * i : 8 * i + 8], "little") for i in range(count))


def round_keys(seed: int, epoch: int) -> tuple[int, ...]:
    """The round keys of the order of ``epoch`` under ``seed`` (the first also keys its table)."""
    return hashed_words(f"{seed}:{epoch}", ROUNDS, b"ydl-order-v1")


# --- tables ---


def fisher_yates(n: int, key: int) -> npt.NDArray[np.int64]:
    """A uniformly random order of ``range(n)`` drawn from a splitmix64 stream seeded by
    ``key``: integer arithmetic only, so it is the same on every machine and numpy version."""
    return fisher_yates_rows(n, [key])[0]


def fisher_yates_rows(n: int, keys: Sequence[int]) -> npt.NDArray[np.int64]:
    """``fisher_yates(n, key)`` for each of ``keys``, as the rows of one array: the swaps of all
    rows are made together (a mixture up-samples a small source through many epochs at once).
    Row ``r`` is ``fisher_yates(n, keys[r])``, bit for bit."""
    if n < 2 or len(keys) < _ROWS_TOGETHER:
        # A Python loop of swaps costs about 0.1 us a step, one numpy step about 5 us whatever
        # the rows: a few rows are faster alone.
        tables = [np.frombuffer(_swapped(n, key), np.int64) for key in keys]
        return np.stack(tables) if tables else np.zeros((0, n), np.int64)
    table = np.tile(np.arange(n, dtype=np.int64), (len(keys), 1))
    targets = np.array([_swap_targets(n, key) for key in keys], dtype=np.int64)
    rows = np.arange(len(keys))
    for step, i in enumerate(range(n - 1, 0, -1)):
        j = targets[:, step]
        swapped = table[rows, j]
        table[rows, j] = table[:, i]
        table[:, i] = swapped
    return table


def _swapped(n: int, key: int) -> array.array[int]:
    """``range(n)`` shuffled by the swaps ``_swap_targets`` draws (an array of int64: swapped
    as fast as a list's items, and viewed by numpy without a conversion)."""
    table = array.array("q", range(n))
    if n > 1:
        for i, j in zip(range(n - 1, 0, -1), _swap_targets(n, key)):
            table[i], table[j] = table[j], table[i]
    return table


def _swap_targets(n: int, key: int) -> list[int]:
    """The swap target of each step of a Fisher-Yates shuffle of ``range(n)`` (step ``k`` swaps
    place ``n - 1 - k`` with the target) drawn from splitmix64 seeded by ``key``: all at once
    with numpy, or one by one when one of them is rejected (about once in 2**50 tables)."""
    at_once = draws_at_once(n, key)
    return at_once if at_once is not None else _draws_one_by_one(n, key)


def draws_at_once(n: int, key: int) -> list[int] | None:
    """``_swap_targets`` with numpy, or None if one of the draws is rejected (the loop then
    draws): the same numbers as the loop, bit for bit."""
    assert n < 1 << 31  # the product's halves below stay inside 64 bits
    states = np.uint64(key) + np.arange(n - 1, dtype=np.uint64) * np.uint64(GOLDEN)
    bounds = np.arange(n, 1, -1, dtype=np.uint64)
    targets, low_word = wide_product(splitmix64_array(states), bounds)
    reject_below = (np.uint64(MASK64) % bounds + np.uint64(1)) % bounds  # (2**64) % bound
    if (low_word < reject_below).any():
        return None
    return targets.tolist()  # (Python ints: the swaps below index a list with them)


def _draws_one_by_one(n: int, key: int) -> list[int]:
    draws, state = [], key
    for bound in range(n, 1, -1):
        reject = (1 << 64) % bound  # Lemire: unbiased draws from [0, bound)
        while True:
            product = splitmix64(state) * bound
            state = (state + GOLDEN) & MASK64
            if product & MASK64 >= reject:
                break
        draws.append(product >> 64)
    return draws


def wide_product(draws: U64, bounds: U64) -> tuple[U64, U64]:
    """The high and low 64-bit words of each 128-bit ``draw * bound``, for bounds below 2**31
    (numpy has no 128-bit integers: the draw is taken in 32-bit halves)."""
    high_part = (draws >> np.uint64(32)) * bounds
    low_part = (draws & np.uint64(0xFFFFFFFF)) * bounds
    high_word = (high_part + (low_part >> np.uint64(32))) >> np.uint64(32)
    low_word = (high_part << np.uint64(32)) + low_part  # wraps modulo 2**64, as it should
    return high_word, low_word


# --- the network ---


def side_of(n: int) -> int:
    """The side ``a = ceil(sqrt(n))`` of the network's square domain ``Z_a x Z_a`` for ``n``."""
    return math.isqrt(n - 1) + 1 if n > 1 else 1


def feistel(values: U64, side: np.uint64 | U64, keys: Keys) -> None:
    """One pass of the network with these round ``keys``, in place, over values in
    ``[0, side * side)``. ``side`` and each key are one number, or one per value (a windowed
    shuffle permutes many windows, each with its own network, in one pass)."""
    left = values // side
    right = values - left * side
    t = np.empty_like(values)
    u = np.empty_like(values)
    for i, key in enumerate(keys):
        src, dst = (right, left) if i % 2 == 0 else (left, right)
        _round_value(src, key, side, t, u)
        # (dst + t) mod a for dst, t < a: subtracting a wraps to a huge uint64 when the
        # sum is already below a, so the minimum picks the right one.
        np.add(dst, t, out=dst)
        np.subtract(dst, side, out=u)
        np.minimum(dst, u, out=dst)
    np.multiply(left, side, out=left)
    np.add(left, right, out=values)


def _round_value(src: U64, key: np.uint64 | U64, side: np.uint64 | U64, t: U64, u: U64) -> None:
    """Into ``t``: the round function of ``src``, uniform in ``[0, side)`` (``u``: scratch)."""
    np.bitwise_xor(src, key, out=t)
    np.multiply(t, _C1_U64, out=t)
    np.right_shift(t, _SHIFT_U64, out=u)
    np.bitwise_xor(t, u, out=t)
    np.multiply(t, _C2_U64, out=t)
    # Top 32 bits times a, top half of that: uniform in [0, a) without a division.
    t >>= _HALF_WORD_U64
    t *= side
    t >>= _HALF_WORD_U64


def feistel_scalar(value: int, side: int, keys: Sequence[int]) -> int:
    """``feistel`` of one value, with Python ints: for the last few values of a cycle walk,
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


def cycle_walk(values: U64, n: np.uint64 | U64, side: np.uint64 | U64, keys: Keys) -> None:
    """Passes ``values`` through the network (``side``, ``keys``) in place, again and again for
    those still outside ``[0, n)``. ``n``, ``side`` and the keys are each one number (one
    network for all), or all one per value (a network per value: the windows of a windowed
    shuffle)."""
    feistel(values, side, keys)
    pending = np.flatnonzero(values >= n)
    if not pending.size:  # (the usual case: a square overshoots n by little)
        return
    per_value = isinstance(side, np.ndarray)
    # A walk through a bijection of [0, side * side) reaches [0, n) within side * side - n + 1
    # steps; more means a bug, which had better raise than hang a data loader.
    if per_value:
        limit = int(np.max(np.asarray(side) * np.asarray(side) - np.asarray(n))) + 1
    else:
        limit = int(side) * int(side) - int(n) + 1
    for _ in range(limit):
        if pending.size <= _SCALAR_TAIL:
            break
        walked = values[pending]
        if per_value:
            feistel(walked, side[pending], tuple(key[pending] for key in keys))  # type: ignore[index]
            values[pending] = walked
            pending = pending[walked >= n[pending]]  # type: ignore[index]
        else:
            feistel(walked, side, keys)
            values[pending] = walked
            pending = pending[walked >= n]
    if not pending.size:
        return
    if not per_value:  # (one network for all: its numbers made ints once)
        ints = int(n), int(side), [int(key) for key in keys]
    for i in pending.tolist():
        if per_value:
            ints = int(n[i]), int(side[i]), [int(key[i]) for key in keys]  # type: ignore[index]
        values[i] = _walk_on(int(values[i]), *ints)


def walk_scalar(position: int, n: int, side: int, keys: Sequence[int]) -> int:
    """``cycle_walk`` of one position, with Python ints (a numpy pass costs ~70 ufunc calls)."""
    return _walk_on(feistel_scalar(position, side, keys), n, side, keys)


def _walk_on(value: int, n: int, side: int, keys: Sequence[int]) -> int:
    """``value`` (one pass through the network done) walked on until it is in ``[0, n)``."""
    # A walk through a bijection of [0, side * side) reaches [0, n) within side * side - n + 1
    # steps; more means a bug, which had better raise than hang a data loader.
    for _ in range(side * side - n + 1):
        if value < n:
            return value
        value = feistel_scalar(value, side, keys)
    raise RuntimeError("cycle-walking did not end; the network is not a bijection")


# --- positions ---


def range_message(position: int, n: int) -> str:
    if not n:
        return f"Got position {position}, but the permutation is empty (n=0)"
    return f"Got position {position}, allowed positions are in [0, {n - 1}]"


def checked_position(position: Any, n: int) -> int:
    """``position`` as an int in ``[0, n)``: TypeError for a bool or non-int, IndexError
    naming the allowed range."""
    if isinstance(position, (bool, np.bool_)):
        raise TypeError(f"Permutation positions are ints, got the bool {position!r}")
    pos = operator.index(position)
    if not 0 <= pos < n:
        raise IndexError(range_message(pos, n))
    return pos


def checked_positions(positions: npt.ArrayLike, n: int) -> tuple[npt.NDArray[Any], U64]:
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
        raise IndexError(range_message(bad, n))
    return pos, work


class Permutation:
    """A keyed pseudo-random bijection of ``[0, n)``: ``p[position] -> index``.

    Fixed by ``(n, seed, epoch)`` alone, identical in every process. Construction and memory
    are O(1); ``indices`` evaluates many positions at once with numpy. Up to ``table_max``
    positions (``TABLE_MAX`` unless a windowed shuffle asks for fewer) the order is an exact
    keyed Fisher-Yates shuffle, kept as a table made on first use.
    """

    __slots__ = ("_keys", "_np_keys", "_side", "_table", "_table_max", "epoch", "n", "seed")

    def __init__(self, n: int, seed: int, epoch: int = 0, *, table_max: int = TABLE_MAX) -> None:
        self.n = check_int("n", n, 0, _MAX_N)
        self.seed = check_int("seed", seed, 0)
        self.epoch = check_int("epoch", epoch, 0)
        self._table_max = check_int("table_max", table_max, 0, TABLE_MAX)
        # A balanced network over Z_a x Z_a with a = ceil(sqrt(n)): the domain a * a overshoots
        # n by fewer than 2a values, so cycle-walking rarely needs a second pass. (Halves of h
        # bits would overshoot by up to 4x, and the walk would cost up to 4x.)
        self._side = side_of(self.n)
        self._keys = round_keys(self.seed, self.epoch)
        self._np_keys = tuple(np.uint64(k) for k in self._keys)
        self._table: npt.NDArray[np.int64] | None = None  # made on first use, small n only

    @staticmethod
    def tables(n: int, seed: int, epochs: Sequence[int]) -> npt.NDArray[np.int64]:
        """The orders of ``Permutation(n, seed, e)`` for each of ``epochs`` (n at most
        ``TABLE_MAX``), as the rows of one array, made together."""
        check_int("n", n, 0, TABLE_MAX)
        return fisher_yates_rows(n, [round_keys(seed, e)[0] for e in epochs])

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Permutation(n={self.n}, seed={self.seed}, epoch={self.epoch})"

    def __getitem__(self, position: int) -> int:
        pos = checked_position(position, self.n)
        if self.n <= self._table_max:
            return int(self._small_table()[pos])
        return walk_scalar(pos, self.n, self._side, self._keys)

    def indices(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Returns the record index at each position, as int64 with the shape of ``positions``.

        Raises IndexError if a position is outside ``[0, n)``.
        """
        pos, work = checked_positions(positions, self.n)
        return self.permute(work.reshape(-1)).reshape(pos.shape)

    def permute(self, values: U64) -> npt.NDArray[np.int64]:
        """Permutes in-range uint64 positions in place and returns them viewed as int64 (the
        unchecked ``indices``, for orders that made the positions themselves)."""
        if self.n <= self._table_max:
            values[:] = self._small_table()[values.view(np.int64)]
            return values.view(np.int64)
        n, side = np.uint64(self.n), np.uint64(self._side)
        for begin in range(0, values.size, BLOCK):
            cycle_walk(values[begin : begin + BLOCK], n, side, self._np_keys)
        return values.view(np.int64)

    def _small_table(self) -> npt.NDArray[np.int64]:
        if self._table is None:
            self._table = fisher_yates(self.n, self._keys[0])
        return self._table
