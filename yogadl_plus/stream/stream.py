"""Stream: which record comes next, as index arithmetic, then the work at the boundary.

What each position of each epoch reads is the stream's ``plan()`` (a pure function of the
position). The stream cuts an epoch's positions into units, has the plan's reader read each
unit (inline, or ahead of the caller in a pool of threads or processes, always handed back in
order), and turns the blocks into records, windows or batches. It only keeps where it is
(``offset``), so resuming anywhere costs the same as starting at 0.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterator, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

from yogadl_plus.checks import check_int
from yogadl_plus.errors import NothingPassedWarning
from yogadl_plus.stream.batching import take, whole_batches
from yogadl_plus.stream.block import Block, as_items
from yogadl_plus.stream.keywords import StreamSettings, routed
from yogadl_plus.stream.ledger import Ledger, position_after
from yogadl_plus.stream.lineage import lineage, position_after_items
from yogadl_plus.stream.plan import StreamPlan
from yogadl_plus.stream.state import StreamState
from yogadl_plus.stream.stats import StatsCounter, StreamStats
from yogadl_plus.stream.units import FIRST_RECORDS
from yogadl_plus.stream.workers import OrderedPool

if TYPE_CHECKING:
    from yogadl_plus.order.settings import OrderSettings
    from yogadl_plus.stream.settings import BoundarySettings, WorkerSettings
    from yogadl_plus.streamsource import StreamSource

__all__ = ["Stream"]


# Iterations whose ledgers offset_after can still answer for: the current one, and those a
# consumer reading ahead across epochs (tf.data's .repeat() with a prefetch) may still be in.
_LEDGERS_KEPT = 3


class Stream:
    """One shard of a source's epochs, one after the other (made by ``source.stream(...)``).

    Each ``iter()`` is one epoch, the next one each time, even when the last was left
    unfinished. ``offset`` is the ``start_offset`` that resumes right after the last item
    handed out; ``global_offset`` is the ``global_start`` that resumes there on any number of
    shards. A consumer that reads ahead resumes with ``offset_after(epoch, items consumed)``.
    ``plan()`` is what a framework face builds on. See docs/streams.md.
    """

    def __init__(
        self,
        source: StreamSource,
        order: OrderSettings,
        boundary: BoundarySettings,
        workers: WorkerSettings,
    ) -> None:
        self.source = source
        self.workers = workers
        self._plan = StreamPlan(source, order.seeded(), boundary, StatsCounter())
        #: The seed in use (drawn at random when shuffle=True and none was given).
        self.shuffle_seed = self._plan.order.settings.shuffle_seed
        self._pool = (
            OrderedPool(
                self._plan.reader,
                workers.num_workers,
                workers.worker_type,
                workers.prefetch,
                workers.worker_start_method,
            )
            if workers.num_workers
            else None
        )
        self._epoch, self._position = self._next = self._plan.position_of(order.start_offset)
        self._ledgers: deque[Ledger] = deque(maxlen=_LEDGERS_KEPT)
        self._handing: np.ndarray | None = None  # the ends of the block records come from

    def __getstate__(self) -> dict[str, Any]:
        # A copy sent to another process reads inline: it takes neither this stream's worker
        # pool nor what it handed out.
        state = dict(self.__dict__)
        state["_pool"] = None
        state["_ledgers"] = deque(maxlen=_LEDGERS_KEPT)
        state["_handing"] = None
        return state

    def plan(self) -> StreamPlan:
        """What this stream reads at every (epoch, position), and how (see StreamPlan)."""
        return self._plan

    @property
    def batch_size(self) -> int | None:
        """Records per item (None: items are records or windows)."""
        return self._plan.boundary.batch_size

    def replace(self, **changes: Any) -> Stream:
        """The same stream (same seed, same start) with some of ``stream(...)``'s arguments
        changed."""
        now = StreamSettings(self._plan.order.settings, self._plan.boundary, self.workers)
        return Stream(self.source, *routed(changes, over=now, who="replace()"))

    def __repr__(self) -> str:
        plan = self._plan
        return (
            f"Stream({self.source!r}, order={plan.order!r}, offset={self.offset}, "
            f"batch_size={self.batch_size}, num_workers={self.workers.num_workers})"
        )

    def __len__(self) -> int:
        """Items (records, windows or batches) in one whole epoch of this shard; with a
        predicate, an upper bound."""
        return self._plan.items_per_epoch

    # --- where it is ---

    @property
    def offset(self) -> int:
        """The start_offset that resumes right after the last item handed out."""
        return self._plan.offset_of(self._epoch, self._position)

    @property
    def global_offset(self) -> int:
        """The global_start that resumes right after the last item handed out, on any number of
        shards: exact when every shard has handed out as many positions as this one."""
        return self._plan.order.global_offset(self._epoch, self._position)

    @property
    def next_epoch_position(self) -> tuple[int, int]:
        """(epoch, position) where the next iter() starts."""
        return self._next

    def state(self) -> StreamState:
        """Where the stream is (``offset``) and what it was made with, checked by
        ``load_state``: see StreamState. ``state().to_dict()`` is JSON for a checkpoint."""
        return self._plan.state_at(self.offset)

    def load_state(self, state: StreamState | Mapping[str, Any]) -> None:
        """Resume where ``state`` (from ``state()``, or its ``to_dict()``) says: the next
        ``iter()`` starts at its offset. ValueError, naming what differs, if it was saved from a
        stream whose offsets mean other records (another version or build, order, seed,
        shards or n-gram, or a mixture's schedule in an epoch it has read)."""
        if not isinstance(state, StreamState):
            state = StreamState.from_dict(state)
        self._plan.check_state(state)
        self.seek(state.offset)

    def seek(self, offset: int) -> None:
        """Make the next ``iter()`` start at ``start_offset=offset``, as a stream made with it
        would (where a restored checkpoint says to resume)."""
        self._next = self._epoch, self._position = self._plan.position_of(offset)

    def offset_after(self, epoch: int, items: int | None = None) -> int:
        """The start_offset that resumes right after the first ``items`` items this stream
        handed out in its iteration of ``epoch`` (None: after the whole epoch).

        For consumers that read ahead (a queue) and ranks restarted alone: items consumed in
        an epoch (``next_epoch_position[0]`` before its ``iter()``), mapped to the exact resume
        point, with or without a predicate: from the last three iterations' record, or for an
        epoch not iterated, counted from where its iteration would begin. A count past an
        epoch's end means the whole epoch (records in batches may overshoot)."""
        epoch = check_int("epoch", epoch, 0)
        plan = self._plan
        length = plan.epoch_length(epoch)
        if items is None:
            return plan.offset_of(epoch, length)
        items = check_int("items", items, 0)
        return plan.offset_of(epoch, _after(plan, self._ledgers, self._next, epoch, items))

    def handed_out(self, epoch: int) -> int:
        """How many items this stream's latest iteration of ``epoch`` has handed out so far (0
        for an epoch it has not iterated). For a consumer that reads ahead: while the count is
        past the items it consumed, the epoch has another one on its way to it."""
        epoch = check_int("epoch", epoch, 0)
        return next((led.count for led in reversed(self._ledgers) if led.epoch == epoch), 0)

    def lineage(self, n: int, start_offset: int | None = None) -> list[Any]:
        """The records each of the next ``n`` items is made of, from ``offset`` (or
        ``start_offset``): see stream/lineage.py (fewer only where no more can follow)."""
        offset = self.offset if start_offset is None else start_offset
        return lineage(self._plan, *self._plan.position_of(offset), check_int("n", n, 0))

    # --- where the time goes ---

    def stats(self) -> StreamStats:
        """Items and bytes handed out and the seconds spent reading, decoding, in predicates,
        transforms, batching, waiting on workers and in the consumer (see StreamStats)."""
        handing = self._handing
        extra = 0
        if handing is not None:  # records handed out of the block being handed out
            extra = int(np.searchsorted(handing, self._position, side="right"))
        return self._plan.stats.snapshot(extra)

    def reset_stats(self) -> None:
        """Count ``stats()`` from now."""
        self._plan.stats.reset()
        self._plan.stats.begin()

    # --- iteration ---

    def __iter__(self) -> Iterator[Any]:
        epoch, position, ledger = self._begin()
        if self.batch_size is None:
            return self._items(epoch, position, ledger)
        return self._batches(epoch, position, ledger)

    def iter_blocks(self) -> Iterator[Block]:
        """The next epoch as ``iter()`` would hand it out (same items, order, offsets and
        ledger), a block of records at a time: columns (field -> array or list) without a
        transform, else the list of items. For faces that hand records over in bulk.

        A batching stream gives blocks of whole batches (columns, a multiple of
        ``batch_size`` records; the epoch's short last batch ends the last block unless
        ``drop_last``), each batch written down as one item handed out. Its batches must be
        plain runs of records: no predicate or skip list (batches fill across blocks) and no
        transform."""
        boundary = self._plan.boundary
        if boundary.batch_size is None:
            return self._handed_blocks(*self._begin())
        _check_plain_batches(boundary)
        return self._handed_batch_blocks(*self._begin())

    def close(self) -> None:
        """Stop worker threads or processes now (they start again on the next iteration)."""
        if self._pool is not None:
            self._pool.close()

    def _begin(self) -> tuple[int, int, Ledger]:
        """Start the next iteration: its epoch, first position and ledger."""
        self._plan.stats.begin()
        epoch, position = self._next
        self._next = (epoch + 1, 0)  # the next iter() is the next epoch, finished or not
        ledger = Ledger(epoch, position)
        self._ledgers.append(ledger)
        return epoch, position, ledger

    def _blocks(self, epoch: int, position: int, many_batches: bool = False) -> Iterator[Block]:
        plan = self._plan
        boundary, sizes = plan.boundary, plan.sizes
        unit = sizes.read_block if boundary.batch_size is None else boundary.batch_size
        if boundary.filtered:
            # Batches fill from passing records across units; a unit of one batch's positions
            # would leave each unit's fixed cost to a handful of passing records.
            unit = max(unit, sizes.read_block)
        if (self._pool is not None or many_batches) and boundary.transform is None:
            # (A transform's work dwarfs the hand-over, and its output may be far bigger than
            # the records: units stay a batch, so that memory and the first batch's wait do.)
            unit = max(unit, unit * (sizes.pool_unit // unit))
        # The first unit is short, so that the first item comes quickly: a few records, or one
        # batch (a unit of many, of a true shuffle over many chunks, opens that many more).
        first = FIRST_RECORDS if boundary.batch_size is None else boundary.batch_size
        units = plan.units.runs(epoch, position, unit, first)
        if self._pool is None:
            return _timed(plan.stats, map(plan.reader, units), waited=False)
        return _timed(plan.stats, self._pool.map(units), waited=True)

    def _epoch_done(self, epoch: int, ledger: Ledger) -> None:
        self._epoch, self._position = epoch, self._plan.epoch_length(epoch)
        _finished(self._plan, ledger)

    def _items(self, epoch: int, position: int, ledger: Ledger) -> Iterator[Any]:
        stats = self._plan.stats
        for block in self._blocks(epoch, position):
            items = as_items(block).items
            assert items is not None
            ledger.add(block.ends)
            self._epoch = epoch
            self._handing = block.ends  # stats() counts the records handed out of it
            # The loop stores each record's end as the stream's position: one store per record.
            for self._position, item in zip(block.ends.tolist(), items):
                yield item
            self._handing = None
            stats.handed(len(items))
        self._epoch_done(epoch, ledger)

    def _handed_blocks(self, epoch: int, position: int, ledger: Ledger) -> Iterator[Block]:
        stats = self._plan.stats
        for block in self._blocks(epoch, position):
            if len(block):
                ledger.add(block.ends)
                self._epoch, self._position = epoch, int(block.ends[-1])
                stats.handed(len(block))
                yield block
        self._epoch_done(epoch, ledger)

    def _handed_batch_blocks(self, epoch: int, position: int, ledger: Ledger) -> Iterator[Block]:
        size = self.batch_size
        assert size is not None
        stats = self._plan.stats
        for block in self._blocks(epoch, position, many_batches=True):
            # Units are whole batches from ``position``: only the epoch's last may be short.
            if len(block) % size and self._plan.boundary.drop_last:
                block = block.sliced(0, len(block) - len(block) % size)
            if not len(block):
                continue
            ends = block.ends[size - 1 :: size]
            if len(block) % size:
                ends = np.append(ends, block.ends[-1])
            ledger.add(ends)
            self._epoch, self._position = epoch, int(block.ends[-1])
            stats.handed(len(block), len(ends))
            yield block
        self._epoch_done(epoch, ledger)

    def _batches(self, epoch: int, position: int, ledger: Ledger) -> Iterator[Any]:
        size = self.batch_size
        assert size is not None
        stats = self._plan.stats
        boundary = self._plan.boundary
        pending: list[Block] = []
        count = 0
        # Plain runs of records come in units of several batches, each read in one go (the
        # fixed cost of reading a unit is paid once for all) and handed out batch by batch,
        # views of it.
        plain = not boundary.filtered and boundary.transform is None
        for block in self._blocks(epoch, position, many_batches=plain):
            if not pending and block.columns is not None and len(block) >= size:
                for end, batch in whole_batches(block, size):
                    yield self._handed_batch(epoch, end, size, ledger, batch)
                if not len(block) % size:
                    continue
                block = block.sliced(len(block) - len(block) % size, len(block))
            pending.append(block)
            count += len(block)
            while count >= size:
                began = perf_counter()
                batch, end, pending = take(pending, size)
                stats.add_batching(perf_counter() - began)
                count -= size
                yield self._handed_batch(epoch, end, size, ledger, batch)
        if count and not self._plan.boundary.drop_last:
            batch, end, _ = take(pending, count)
            yield self._handed_batch(epoch, end, count, ledger, batch)
        self._epoch_done(epoch, ledger)

    def _handed_batch(self, epoch: int, end: int, records: int, ledger: Ledger, batch: Any) -> Any:
        """``batch`` (of ``records`` ending at position ``end``), written down as handed out."""
        ledger.add_one(end)
        self._epoch, self._position = epoch, end
        self._plan.stats.handed(records, 1)
        return batch


def _timed(stats: StatsCounter, blocks: Iterator[Block], waited: bool) -> Iterator[Block]:
    """``blocks``, each counted in ``stats`` with the time it took to arrive."""
    while True:
        began = perf_counter()
        block = next(blocks, None)
        if block is None:
            return
        stats.add_block(len(block), block.nbytes, block.work, perf_counter() - began, waited)
        yield block


def _after(
    plan: StreamPlan, ledgers: deque[Ledger], next_start: tuple[int, int], epoch: int, items: int
) -> int:
    """The position after ``items`` items of ``epoch``: from this stream's record of its
    iteration, else (an epoch it has not iterated: a rank restarted alone) counted from where
    its iteration would begin."""
    if any(ledger.epoch == epoch for ledger in ledgers):
        return position_after(ledgers, epoch, items, plan.epoch_length(epoch))
    start = next_start[1] if next_start[0] == epoch else 0
    return position_after_items(plan, epoch, start, items)


def _check_plain_batches(boundary: BoundarySettings) -> None:
    """ValueError unless a batching stream's batches are plain runs of records."""
    if boundary.filtered or boundary.transform is not None:
        raise ValueError(
            "iter_blocks() of a batching stream gives blocks of whole batches of records: "
            "a stream with a predicate, skip= or a transform hands its batches out with iter()"
        )


def _finished(plan: StreamPlan, ledger: Ledger) -> None:
    """``ledger``'s iteration reached the end of its epoch. A NothingPassedWarning (a
    UserWarning, as Petastorm's) when the predicate kept nothing of a whole epoch that had
    records: rarely what was meant. (Of one shard's epoch it says no more: shuffled shards hold
    other records each epoch.)"""
    ledger.finished = True
    predicate = plan.boundary.predicate
    if predicate is None or ledger.count or ledger.start:
        return
    positions = plan.epoch_length(ledger.epoch)
    if positions:
        shard = " of this shard" if plan.order.settings.num_shards > 1 else ""
        warnings.warn(
            f"the predicate {predicate!r} kept none of the {positions} records of epoch "
            f"{ledger.epoch}{shard}: check the fields and values it tests (one that keeps no "
            "record leaves every epoch empty)",
            NothingPassedWarning,
            stacklevel=3,
        )
