"""Ledger: where each item one iteration of a stream handed out ends.

A consumer that reads ahead (tf.data's prefetch, Keras's queue, a training loop's own buffer)
knows how many items it *consumed*, not where the stream stands. The ledger turns "k items
of this epoch's iteration" into the position right after the k-th of them, exactly, with or
without a predicate: the stream writes down the positions each block it handed out covered.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

__all__ = ["Ledger", "position_after"]


class Ledger:
    """The end position of every item one iteration (one epoch, from ``start``) handed out.

    Items of consecutive positions (no predicate) cost one entry per block; a block thinned by a
    predicate keeps its ends as 4-byte offsets from its first end.
    """

    def __init__(self, epoch: int, start: int) -> None:
        self.epoch = epoch
        self.start = start
        self.count = 0  # items handed out so far
        self.finished = False  # the iteration reached the end of the epoch
        self._firsts: list[int] = []  # the item number each run starts at
        self._runs: list[tuple[int, np.ndarray | None, int]] = []  # (first end, offsets, items)

    def add(self, ends: np.ndarray) -> None:
        """Items whose positions end at ``ends`` (increasing) were handed out, in this order."""
        n = len(ends)
        if not n:
            return
        first = int(ends[0])
        offsets = None if int(ends[-1]) - first == n - 1 else (ends - first).astype(np.uint32)
        self._firsts.append(self.count)
        self._runs.append((first, offsets, n))
        self.count += n

    def add_one(self, end: int) -> None:
        """One item (a batch) ending at position ``end`` was handed out."""
        self._firsts.append(self.count)
        self._runs.append((end, None, 1))
        self.count += 1

    def end_of(self, items: int) -> int:
        """The position right after the first ``items`` items (``items <= count``)."""
        if items == 0:
            return self.start
        run = bisect.bisect_right(self._firsts, items - 1) - 1
        first, offsets, _ = self._runs[run]
        j = items - 1 - self._firsts[run]
        return first + (j if offsets is None else int(offsets[j]))


def position_after(ledgers: Sequence[Ledger], epoch: int, items: int, length: int) -> int:
    """The position right after the first ``items`` items that the latest of ``ledgers`` for
    ``epoch`` handed out (``length``, the epoch's, once it was read to its end); ValueError
    for an epoch not iterated, or more items than were handed out."""
    ledger = next((led for led in reversed(ledgers) if led.epoch == epoch), None)
    if ledger is None:
        kept = [led.epoch for led in ledgers]
        raise ValueError(
            f"this stream has not iterated epoch {epoch} (it remembers the iterations of "
            f"epochs {kept}): pass the epoch whose items were counted, as "
            "stream.next_epoch_position[0] read before that epoch's iter()"
        )
    if items <= ledger.count:
        return ledger.end_of(items)
    if ledger.finished:
        return length
    raise ValueError(
        f"{items} items of epoch {epoch} counted, but the stream has handed out only "
        f"{ledger.count} of that epoch so far: count only items you received"
    )
