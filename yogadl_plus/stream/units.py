"""An epoch's positions cut into units of work, each with where it reads, announced ahead.

The order costs per call, not per position, so it is computed for many positions at once and
cut into units; each unit is ``(first position, Placement)``, what the reader takes. Units are
announced to the source's DataRefs (``read_ahead``) some way before they are read: a cold disk
reads their pages meanwhile, a version read on demand fetches their chunks.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from yogadl_plus.order.placement import Placement
    from yogadl_plus.order.shards import ShardOrder
    from yogadl_plus.stream.reader import SourceReader, Unit
    from yogadl_plus.streamsource import StreamSource

__all__ = ["FIRST_RECORDS", "READ_AHEAD_BYTES", "UnitSizes", "Units"]

#: Positions of a record stream's first unit: few, so that the first item comes fast.
FIRST_RECORDS = 32
# Positions placed at once for adapters that ask one item at a time.
_CACHED_BLOCK = 16384
# Positions a unit of work reads when iterating record by record (bounds memory and latency)...
_READ_BLOCK = 512
# ... and about the most bytes it reads: big records come in blocks that stay in the CPU's cache
# and under malloc's mmap threshold (so their memory is reused instead of mapped afresh, a page
# fault per 4 KiB), and a record kept by the caller keeps no more than this alive.
_READ_BLOCK_BYTES = 4 << 20
# Worker pools pay a fixed cost per unit (a hand-over between threads or processes, a wake-up),
# so without a transform their units of small records hold several batches: about this many
# bytes, in whole batches.
_POOL_UNIT_BYTES = 1 << 20
#: How far ahead of the units being read they are announced, in stored bytes (0: never; a
#: benchmark sets it to compare) and at most in positions.
READ_AHEAD_BYTES = 32 << 20
_READ_AHEAD_POSITIONS = 8192


@dataclass(frozen=True)
class UnitSizes:
    """How many positions a unit holds: ``read_block`` record by record, ``pool_unit`` at most
    for worker pools; and how many positions ahead units are announced (``read_ahead``)."""

    read_block: int
    pool_unit: int
    read_ahead: int

    @classmethod
    def of(cls, source: StreamSource, windows: bool) -> UnitSizes:
        """The sizes for ``source``'s records (its n-gram windows, with ``windows``)."""
        record_bytes = source.record_bytes
        read_block = (
            _READ_BLOCK
            if windows
            else max(1, min(_READ_BLOCK, int(_READ_BLOCK_BYTES // record_bytes)))
        )
        # (At most a quarter of a chunk: a unit in chunk order then touches a chunk or two,
        # which a version read on demand through a small local cache must hold at once.)
        pool_unit_bytes = min(_POOL_UNIT_BYTES, source.chunk_bytes / 4)
        read_ahead = (
            max(1, min(_READ_AHEAD_POSITIONS, int(READ_AHEAD_BYTES // record_bytes)))
            if READ_AHEAD_BYTES
            else 0
        )
        return cls(read_block, max(1, int(pool_unit_bytes // record_bytes)), read_ahead)


class Units:
    """Units of one shard's epochs of ``source`` in ``order``: where a run of positions reads,
    and runs of units from any position."""

    def __init__(
        self,
        source: StreamSource,
        order: ShardOrder,
        reader: SourceReader,
        sizes: UnitSizes,
        anchors: np.ndarray | None,
    ) -> None:
        self.source = source
        self.order = order
        self.reader = reader
        self.sizes = sizes
        settings = order.settings
        self._shuffle, self._seed = settings.shuffle, settings.shuffle_seed or 0
        self._block = source.place_block
        self._cached: tuple[int, int, int, Placement] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cached": None}

    def placed(self, epoch: int, start: int, stop: int) -> Placement:
        """Where positions ``[start, stop)`` of ``epoch`` read."""
        indices = self.order.indices(epoch, start, stop)
        placement = self.source.place(epoch, indices, self._shuffle, self._seed)
        placement.epoch = epoch
        return placement

    def cached(self, epoch: int, start: int, stop: int) -> Placement:
        """``placed``, sliced from a block placed for many positions at once (the order costs
        per call; adapters ask one item at a time)."""
        cached = self._cached
        if cached is None or cached[0] != epoch or not cached[1] <= start <= stop <= cached[2]:
            length = self.order.epoch_length(epoch)
            end = min(max(stop, start + _CACHED_BLOCK), length)
            cached = self._cached = (epoch, start, end, self.placed(epoch, start, end))
        return cached[3][start - cached[1] : stop - cached[1]]

    def runs(self, epoch: int, position: int, unit: int, first: int = 0) -> Iterator[Unit]:
        """Consecutive units of at most ``unit`` positions from ``position`` to the end of the
        epoch, each announced to the source's DataRefs about ``read_ahead`` positions before it
        is read (n-gram windows announce their anchor records); the first of ``first``
        positions, where that is not 0 (so that the first item comes quickly)."""
        span = max(unit, self._block // unit * unit)
        spans = self._spans(epoch, position, span, min(first, unit))
        if span <= self.sizes.read_ahead:
            # (Spans announced whole, a hint per span instead of one per unit: a warm stream
            # of small records pays its hints per several thousand positions.)
            spans = self._announced(spans)
        units = ((at + k * unit, run) for at, whole in spans for k, run in _cut(whole, unit))
        return units if span <= self.sizes.read_ahead else self._announced(units)

    def _spans(self, epoch: int, position: int, span: int, first: int) -> Iterator[Unit]:
        """Runs of ``span`` positions from ``position`` to the end of the epoch, each placed in
        one call; the first of ``first`` positions, where that is not 0."""
        length = self.order.epoch_length(epoch)
        if first and position < length:
            stop = min(position + first, length)
            yield position, self.placed(epoch, position, stop)
            position = stop
        while position < length:
            stop = min(position + span, length)
            yield position, self.placed(epoch, position, stop)
            position = stop

    def _announced(self, runs: Iterator[Unit]) -> Iterator[Unit]:
        """``runs``, each announced about ``read_ahead`` positions before it is handed on."""
        ahead = self.sizes.read_ahead
        if not ahead:
            yield from runs
            return
        runs = iter(runs)
        # The first is read at once (a bucket fetches its chunks meanwhile, a local disk is
        # told nothing); the window after it is announced only then, so that the first item
        # does not wait for the read-ahead to start on it.
        for run in itertools.islice(runs, 1):
            self.reader.read_ahead(run[1], now=True)
            yield run
        queued: deque[Unit] = deque()
        positions = 0
        for run in runs:
            placement = run[1]
            self.reader.read_ahead(placement)
            queued.append(run)
            positions += placement.length
            while queued and positions - queued[0][1].length >= ahead:
                positions -= queued[0][1].length
                yield queued.popleft()
        yield from queued


def _cut(placement: Placement, unit: int) -> Iterator[tuple[int, Placement]]:
    """``placement`` cut into runs of ``unit`` positions, numbered."""
    if placement.length <= unit:
        return iter(((0, placement),))
    return enumerate(placement.split(unit))
