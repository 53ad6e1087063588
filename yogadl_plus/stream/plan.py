"""StreamPlan: what a stream reads at every (epoch, position), and how. The adapters' one seam.

A plan is a pure function of the position: the order (which record, or window, each position of
this shard holds), the reader (the boundary's work on a unit of positions), and the state that
names an offset. It moves nothing: the Stream keeps where it is and hands items out; a framework
face asks the plan for any range of any epoch (its own workers, read-ahead, resume) and counts
what it handed out in the stream's stats. docs/streams.md lists its members.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from yogadl_plus.checks import check_int
from yogadl_plus.order.shards import shard_order
from yogadl_plus.stream import ngram_reader
from yogadl_plus.stream.block import Block, as_items
from yogadl_plus.stream.reader import SourceReader
from yogadl_plus.stream.state import StreamState, order_identity
from yogadl_plus.stream.stats import StatsCounter
from yogadl_plus.stream.units import Units, UnitSizes

if TYPE_CHECKING:
    from yogadl_plus.cache.fixed import Allocate
    from yogadl_plus.order.settings import OrderSettings
    from yogadl_plus.schema import Field
    from yogadl_plus.stream.settings import BoundarySettings
    from yogadl_plus.streamsource import StreamSource

__all__ = ["StreamPlan"]


class StreamPlan:
    """What one shard of ``source`` reads at each position of each epoch (see the module).

    Positions are records, or n-gram windows with ``ngram=``. ``epoch_length``, ``indices``,
    ``position_of``/``offset_of`` are the order's arithmetic; ``read`` does the boundary's work
    for a range; ``state_at`` names an offset for a checkpoint; ``begin_stats``/``count_read``
    add what a face handed out to ``stream.stats()``.
    """

    def __init__(
        self,
        source: StreamSource,
        order: OrderSettings,
        boundary: BoundarySettings,
        stats: StatsCounter,
    ) -> None:
        windows = boundary.ngram is not None
        boundary.check_order(order)
        source.check_stream(order, windows)
        self.source = source
        self.boundary = boundary
        anchors = ngram_reader.anchors(boundary.ngram, source.leaves[0].ref) if windows else None
        self.reader = SourceReader(source, boundary, anchors, order.shuffle_seed or 0)
        #: The fields items hold (a mixture's records: those every source has alike).
        self.fields: tuple[Field, ...] = source.stream_fields(boundary.fields, boundary.batching)
        #: What the order arranges: records, or n-gram windows.
        self.num_positions = len(anchors) if anchors is not None else len(source)
        self.order = shard_order(order, self.num_positions, _chunk_positions(source, anchors))
        self.sizes = UnitSizes.of(source, windows)
        self.units = Units(source, self.order, self.reader, self.sizes, anchors)
        self.stats = stats

    def __getstate__(self) -> dict[str, Any]:
        # A copy in another process (a DataLoader worker) counts nothing: the stream's own
        # counter (a lock) stays here.
        return {**self.__dict__, "stats": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.stats = StatsCounter()

    def __repr__(self) -> str:
        return f"StreamPlan({self.source!r}, order={self.order!r}, boundary={self.boundary!r})"

    # --- the order's arithmetic ---

    @property
    def positions_per_epoch(self) -> int:
        """Positions of this shard in a whole epoch."""
        return self.order.shard_length

    def epoch_length(self, epoch: int) -> int:
        """Positions of this shard in ``epoch``: ``positions_per_epoch``, or fewer in a first
        epoch begun part-way by ``global_start``."""
        return self.order.epoch_length(epoch)

    @property
    def items_per_epoch(self) -> int:
        """Items (records, windows or batches) in a whole epoch of this shard; with a
        predicate, an upper bound."""
        return self.items_in(self.positions_per_epoch)

    def items_from(self, epoch: int, position: int) -> int:
        """Items an iteration of ``epoch`` begun at ``position`` hands out; with a predicate,
        an upper bound."""
        return self.items_in(max(self.epoch_length(epoch) - position, 0))

    def items_in(self, positions: int) -> int:
        """Items (records, windows or batches) that ``positions`` positions which each hand
        one out make in an iteration."""
        size = self.boundary.batch_size
        if size is None:
            return positions
        return positions // size if self.boundary.drop_last else -(-positions // size)

    def shard_items(self, epoch: int) -> list[int]:
        """Items every shard (rank 0, 1, ...) hands out in ``epoch``: equal with
        ``drop_shard_remainder`` or ``pad_shard_remainder``, else they may differ by one; with
        a predicate, upper bounds."""
        return [self.items_in(length) for length in self.order.shard_lengths(epoch)]

    def indices(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """What the order puts at this shard's positions [start, stop) of ``epoch``: record
        indices (indices of n-gram windows with ``ngram=``; a mixture's slots), clipped to the
        epoch."""
        return self.order.indices(epoch, start, stop)

    def position_of(self, offset: int) -> tuple[int, int]:
        """(epoch, position) of a ``start_offset``: positions count from the first epoch's
        start (``global_start``'s place in it, if any)."""
        return self.order.positions.position_of(check_int("offset", offset, 0))

    def offset_of(self, epoch: int, position: int) -> int:
        """The ``start_offset`` of this shard's ``position`` in ``epoch`` (``position_of``'s
        inverse)."""
        return self.order.positions.offset_of(epoch, position)

    # --- reading ---

    def read(self, epoch: int, start: int, stop: int) -> Block:
        """The block of this shard's positions [start, stop) of ``epoch``, read at the boundary
        (predicate, decode, transform): records come as items, batches as columns where there
        is no transform."""
        block = self.reader((start, self.units.cached(epoch, start, stop)))
        return as_items(block) if self.boundary.batch_size is None else block

    def decode_into(self, allocate: Allocate | None) -> None:
        """In a worker process: big decoded arrays are made by ``allocate`` (its ring's
        ``empty``), which hands them over without a copy."""
        self.reader.decode_into(allocate)

    # --- naming an offset ---

    def state_at(self, offset: int) -> StreamState:
        """The stream's state with ``offset``: what a checkpoint saves, checked on load."""
        dataset, fingerprint = self.source.identity()
        ngram = self.boundary.ngram
        return StreamState(
            dataset=dataset,
            fingerprint=fingerprint,
            positions=self.num_positions,
            order=order_identity(self.order.settings),
            ngram=ngram.identity() if ngram is not None else None,
            offset=check_int("offset", offset, 0),
            schedule=self.source.schedule_of_state(),
            boundary=self.boundary.identity(),
        )

    def check_state(self, state: StreamState | Mapping[str, Any]) -> None:
        """ValueError, naming what differs, if ``state``'s offset would mean other records
        here: another source, order or n-gram, or a mixture's schedule that differs in an epoch
        the state has read (a stage after it may be added or changed). ``state``: a
        StreamState, or one saved as its ``to_dict()``."""
        if not isinstance(state, StreamState):
            state = StreamState.from_dict(state)
        here = self.state_at(0)
        try:
            state.check_loads_into(here)
        except ValueError as exc:
            # Epoch 0's shares are in the fingerprint: where nothing but the source differs, say
            # also whether the schedules differ, and from which epoch.
            mine, saved = here.identity(), state.identity()
            alike = all(saved[k] == mine[k] for k in ("positions", "order", "ngram"))
            found = self._schedule_difference(state) if alike else None
            if found is not None:
                raise ValueError(f"{exc} ({found})") from None
            raise
        found = self._schedule_difference(state)
        if found is not None:
            raise ValueError(found)

    def _schedule_difference(self, state: StreamState) -> str | None:
        """What differs between ``state``'s schedule and this source's, in the epochs the
        state has read (None: nothing, or no schedule)."""
        epoch, position = self.position_of(state.offset)
        # The epoch the state is in; at an epoch's true start (not where a global_start put
        # this stream's first epoch), the one before it: the state read nothing of this one.
        whole = position == 0 and self.epoch_length(epoch) == self.positions_per_epoch
        return self.source.schedule_difference(state.schedule, epoch - 1 if whole else epoch)

    # --- counting what a face hands out, in stream.stats() ---

    def begin_stats(self) -> None:
        """Start the clock of ``stream.stats()``, if it has not started: a face that reads with
        ``read`` calls it as an epoch starts (iterating the stream does it itself)."""
        self.stats.begin()

    def count_read(self, read: Block, batches: int, seconds: float, waited: bool) -> None:
        """Count the items of ``read`` (a Block whose ``ends``, ``work`` and ``nbytes`` are those
        of the blocks read) as handed out, in ``batches``, and the ``seconds`` the consuming
        thread spent getting them (waiting for a worker when ``waited``)."""
        self.stats.add_block(len(read), read.nbytes, read.work, seconds, waited)
        self.stats.handed(len(read), batches)


def _chunk_positions(source: StreamSource, anchors: np.ndarray | None) -> np.ndarray:
    """Positions per chunk: the source's records per chunk, or the n-gram windows whose anchor
    record lies in each (a windowed shuffle groups windows so)."""
    counts = source.chunk_records
    if anchors is None:
        return counts
    chunk_of = np.searchsorted(np.cumsum(counts), anchors, side="right")
    return np.bincount(chunk_of, minlength=len(counts))
