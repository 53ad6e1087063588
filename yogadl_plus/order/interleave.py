"""Exact shares of a mixture epoch by weight, and an even interleave of them.

``shares`` splits an epoch of ``total`` slots between sources by weight, exactly: largest
remainder rounding, in exact rational arithmetic. ``Interleave`` says, for any slot of the
epoch, which source it belongs to and which of that source's items it is, spreading each
source evenly through the epoch. Pure index arithmetic, vectorized with numpy, in memory
O(number of sources) whatever the epoch's size: a mixture of sources of 10^9 records each
answers any slot at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = ["Interleave", "shares"]

_INT64_MAX = (1 << 63) - 1


def shares(weights: Sequence[Fraction], total: int) -> list[int]:
    """``total`` split in proportion to ``weights`` (non-negative, not all zero): each part is
    its exact share rounded down, and the slots left go one each to the largest remainders
    (the earlier source first among equal ones). The parts sum to ``total``."""
    whole = sum(weights, Fraction(0))
    exact = [w * total / whole for w in weights]
    parts = [math.floor(x) for x in exact]
    left = total - sum(parts)
    by_remainder = sorted(range(len(exact)), key=lambda j: (-(exact[j] - parts[j]), j))
    for j in by_remainder[:left]:
        parts[j] += 1
    return parts


class Interleave:
    """Slots ``[0, sum(counts))`` dealt to sources so that source ``j`` gets ``counts[j]`` of
    them, spread evenly: ``source_and_rank(slots)`` gives each slot's source and its rank among that
    source's slots (0 for its first slot, up to ``counts[j] - 1``).

    The sources are split in halves, recursively; at each split the slots go to the two sides
    as evenly as integers allow (the slots where ``floor(slot * a / T)`` steps up belong to
    the side of ``a`` of the ``T``: a Bresenham line). Each side's share of any stretch of
    slots is then within one of its exact proportion at every level of the split.
    """

    def __init__(self, counts: Sequence[int]) -> None:
        self.counts = [int(c) for c in counts]
        if any(c < 0 for c in self.counts) or not sum(self.counts):
            raise ValueError(f"counts must be non-negative, not all zero: {self.counts}")
        self.total = sum(self.counts)
        # Sources without slots take no part in the split.
        self._sources = [j for j, c in enumerate(self.counts) if c]

    def __len__(self) -> int:
        return self.total

    def __repr__(self) -> str:
        return f"Interleave(counts={self.counts})"

    def source_and_rank(
        self, slots: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(source, rank within that source) of each slot, as int64 arrays of slots' shape."""
        flat = np.asarray(slots, dtype=np.int64).reshape(-1)
        source = np.empty_like(flat)
        rank = np.empty_like(flat)
        for j, (at, ranks) in enumerate(self.deal(flat)):
            source[at] = j
            rank[at] = ranks
        shape = np.shape(slots)
        return source.reshape(shape), rank.reshape(shape)

    def deal(
        self, slots: npt.ArrayLike
    ) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
        """Per source, which of ``slots`` (a 1-d array) it gets, as ascending indices into
        ``slots``, and the rank of each among that source's slots: a mixture reads each
        source's share of a run of slots from this, without a pass per source over them."""
        flat = np.asarray(slots, dtype=np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= self.total):
            bad = int(flat.min()) if flat.min() < 0 else int(flat.max())
            raise IndexError(f"slot {bad} is out of range [0, {self.total})")
        empty = np.zeros(0, np.int64)
        dealt = [(empty, empty)] * len(self.counts)
        self._split(flat, None, self._sources, dealt)
        return dealt

    def _split(
        self,
        slots: npt.NDArray[np.int64],
        where: npt.NDArray[np.int64] | None,
        sources: list[int],
        dealt: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]],
    ) -> None:
        """Deal ``slots`` of the part given to ``sources`` (``slots`` count within that part;
        ``where``: their indices in the slots dealt, None for all of them in order)."""
        if len(sources) == 1:
            dealt[sources[0]] = (np.arange(len(slots)) if where is None else where, slots)
            return
        half = len(sources) // 2
        left = sum(self.counts[j] for j in sources[:half])
        total = left + sum(self.counts[j] for j in sources[half:])
        # Slot s goes left where floor((s + 1) * left / total) steps up from
        # floor(s * left / total), that is where (s * left) mod total >= total - left.
        before, remainder = _floor_divmod(slots, left, total)
        goes_left = remainder >= total - left
        at_left = np.flatnonzero(goes_left)
        at_right = np.flatnonzero(~goes_left)
        self._split(
            before[at_left], at_left if where is None else where[at_left], sources[:half], dealt
        )
        right = slots[at_right] - before[at_right]
        self._split(right, at_right if where is None else where[at_right], sources[half:], dealt)


def _floor_divmod(
    x: npt.NDArray[np.int64], a: int, b: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``divmod(x * a, b)`` exactly, for 0 <= x <= b: in int64 where ``b * a`` fits, else
    with Python's integers (epochs past about 3 * 10^9 slots)."""
    if b * a <= _INT64_MAX:
        product = x * a
        # (numpy divides by one number with multiplications, libdivide: twice as fast as divmod.)
        quotient = product // b
        return quotient, product - quotient * b
    pairs = [divmod(v * a, b) for v in x.tolist()]
    return (
        np.array([q for q, _ in pairs], dtype=np.int64).reshape(x.shape),
        np.array([r for _, r in pairs], dtype=np.int64).reshape(x.shape),
    )
