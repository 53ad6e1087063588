"""Stream: which record comes next, as index arithmetic, then the work at the boundary.

The order is ``EpochOrder``: a pure function of (epoch, position). The stream cuts an epoch's
positions into units, has a BlockReader read each unit (inline, or ahead of the caller in a
pool of threads or processes, always handed back in order), and turns the blocks into records,
windows or batches. It only keeps where it is (``offset``), so resuming anywhere costs the same
as starting at 0.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import numpy as np

from yogadl_plus.boundary import Block, BlockReader, MixtureReader, as_items, collate
from yogadl_plus.checks import check_int
from yogadl_plus.errors import SchemaError
from yogadl_plus.ledger import Ledger
from yogadl_plus.ngram import NGram
from yogadl_plus.order import CHUNK_SHARDS_TAKE_NO_GLOBAL_ORDER, EpochOrder, OrderSettings
from yogadl_plus.predicates import Predicate
from yogadl_plus.stream_state import StreamState, build_fingerprint, order_identity
from yogadl_plus.stream_stats import StatsCounter, StreamStats
from yogadl_plus.workers import WORKER_TYPES, OrderedPool

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef
    from yogadl_plus.mixture import Mixture
    from yogadl_plus.schema import Field

__all__ = ["Stream"]

# Positions whose order is computed at once: few first, so the first item comes fast.
_FIRST_BLOCK = 32
_ORDER_BLOCK = 4096
_MIXTURE_BLOCK = 4 * _ORDER_BLOCK
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
# How far ahead of the units being read the stream announces to the DataRef which records come
# next (read_ahead: a cold disk reads their pages meanwhile, a version read on demand fetches
# their chunks), in stored bytes and at most in positions.
_READ_AHEAD_BYTES = 32 << 20
_READ_AHEAD_POSITIONS = 8192
# Iterations whose ledgers offset_after can still answer for: the current one, and those a
# consumer reading ahead across epochs (tf.data's .repeat() with a prefetch) may still be in.
_LEDGERS_KEPT = 3


class Stream:
    """One shard's view of a dataset, epoch after epoch (see ``DataRef.stream``).

    Each ``iter()`` is one epoch, the next one each time, even when the last was left
    unfinished. ``offset`` is the ``start_offset`` that resumes right after the last item
    handed out; ``global_offset`` is the ``global_start`` that resumes there on any number of
    shards. A consumer that reads ahead resumes with ``offset_after(epoch, items consumed)``.

    Order: ``shuffle``, ``shuffle_seed`` (drawn when None; required with shards),
    ``skip_shuffle_at_epoch_end``, ``shuffle_window`` (shuffle within windows of that many
    chunks; docs/windowed-shuffle.md), ``shard_rank``/``num_shards``/``drop_shard_remainder``,
    ``start_offset`` (positions of this shard from epoch 0), ``global_start`` (elastic resume).
    Boundary: ``fields``, ``predicate`` (ydl.predicates), ``ngram`` (ydl.NGram), ``transform``,
    ``batch_size``/``drop_last``. Workers: ``num_workers``, ``worker_type`` ("thread" or
    "process"), ``prefetch`` (units in flight), ``worker_start_method``. See docs/streams.md
    and docs/boundary.md.
    """

    def __init__(
        self,
        dataref: DataRef | Mixture,
        *,
        start_offset: int = 0,
        global_start: int | None = None,
        shuffle: bool = False,
        shuffle_seed: int | None = None,
        skip_shuffle_at_epoch_end: bool = False,
        shuffle_window: int | None = None,
        shard_rank: int = 0,
        num_shards: int = 1,
        drop_shard_remainder: bool = False,
        shard_by: str = "records",
        fields: Sequence[str] | str | None = None,
        predicate: Any = None,
        ngram: Any = None,
        transform: Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        drop_last: bool = False,
        num_workers: int = 0,
        prefetch: int | None = None,
        worker_type: str = "thread",
        worker_start_method: str | None = None,
    ) -> None:
        self.dataref = dataref
        # The arguments, so that replace() can make the same stream with a few changed.
        self._arguments = {
            k: v for k, v in locals().items() if k not in ("self", "dataref", "__class__")
        }
        self.settings = OrderSettings(
            shuffle=shuffle,
            seed=shuffle_seed,
            skip_shuffle_at_epoch_end=skip_shuffle_at_epoch_end,
            shard_rank=shard_rank,
            num_shards=num_shards,
            drop_shard_remainder=drop_shard_remainder,
            shard_by=shard_by,
            start_offset=start_offset,
            global_start=global_start,
            shuffle_window=shuffle_window,
        ).seeded()
        self.shuffle_seed = self.settings.seed
        self.num_workers = check_int("num_workers", num_workers, 0)
        _check_worker_options(prefetch, worker_type)
        if batch_size is not None:
            check_int("batch_size", batch_size, 1)
        # A mixture (ydl.mix) reads its sources' records through their own DataRefs.
        self.mixture: Mixture | None = None
        single: DataRef | None = None
        if _is_mixture(dataref):
            self.mixture = dataref
            _check_mixture_options(self.settings, ngram)
            self.fields = _mixture_fields(dataref, fields, batch_size is not None)
        else:
            single = cast("DataRef", dataref)
            _check_boundary(single, self.settings, fields, predicate, ngram)
            self.fields = single.select(fields)
        self.ngram = ngram
        self.anchors = ngram.anchors(single) if ngram is not None and single is not None else None
        # What the order arranges: records, or n-gram windows.
        self.num_positions = len(self.anchors) if self.anchors is not None else len(dataref)
        # (A mixture's epoch is one run of slots: it has no chunks of its own.)
        chunk_records = np.array(
            [c.records for c in single.manifest.chunks]
            if single is not None
            else [self.num_positions],
            dtype=np.int64,
        )
        if self.anchors is not None:
            # A window's chunk is its anchor record's: a windowed shuffle groups anchors so.
            chunk_of = np.searchsorted(np.cumsum(chunk_records), self.anchors, side="right")
            chunk_records = np.bincount(chunk_of, minlength=len(chunk_records))
        self.order = self.settings.order(self.num_positions, chunk_records)
        self.predicate = predicate
        self.transform = transform
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.positions_per_epoch = self.order.shard_length
        record_bytes = self._record_bytes = _record_bytes(dataref)
        windows = self.anchors is not None
        self._read_block = (
            _READ_BLOCK
            if windows
            else max(1, min(_READ_BLOCK, int(_READ_BLOCK_BYTES // record_bytes)))
        )
        # (At most a quarter of a chunk: a unit in chunk order then touches a chunk or two,
        # which a version read on demand through a small local cache must hold at once.)
        pool_unit_bytes = min(_POOL_UNIT_BYTES, _chunk_bytes(dataref) / 4)
        self._pool_unit = max(1, int(pool_unit_bytes // record_bytes))
        self._read_ahead = (
            max(1, min(_READ_AHEAD_POSITIONS, int(_READ_AHEAD_BYTES // record_bytes)))
            if _READ_AHEAD_BYTES
            else 0
        )
        # Records are read as columns too (one decode per block); _items makes them records,
        # iter_blocks hands the columns over. N-gram windows come as windows.
        as_columns = transform is None and (batch_size is not None or ngram is None)
        self._reader: BlockReader | MixtureReader
        if single is not None:
            self._reader = BlockReader(
                single,
                self.fields,
                predicate=predicate,
                ngram=ngram,
                anchors=self.anchors,
                transform=transform,
                as_columns=as_columns,
            )
        else:
            assert self.mixture is not None
            self._reader = _mixture_reader(
                self.mixture,
                self.settings,
                fields,
                self.fields,
                predicate,
                transform,
                batching=batch_size is not None,
                as_columns=as_columns,
            )
        self._pool = (
            OrderedPool(self._reader, self.num_workers, worker_type, prefetch, worker_start_method)
            if self.num_workers
            else None
        )
        self._epoch, self._position = self._next = self.locate(self.settings.start_offset)
        self._order_cache: tuple[int, int, int, Any] | None = None
        self._ledgers: deque[Ledger] = deque(maxlen=_LEDGERS_KEPT)
        self._stats = StatsCounter()
        self._handing: np.ndarray | None = None  # the ends of the block records come from

    def __getstate__(self) -> dict[str, Any]:
        # A copy sent to another process (a DataLoader worker) reads inline: it takes neither
        # this stream's worker pool nor its cached order block.
        state = dict(self.__dict__)
        state["_pool"] = None
        state["_order_cache"] = None
        state["_ledgers"] = deque(maxlen=_LEDGERS_KEPT)
        state["_stats"] = None  # (a lock; the copy counts its own, from zero)
        state["_handing"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stats = StatsCounter()

    def replace(self, **changes: Any) -> Stream:
        """The same stream (same seed, same start) with some arguments changed."""
        arguments = {**self._arguments, "shuffle_seed": self.shuffle_seed, **changes}
        return Stream(self.dataref, **arguments)

    def __repr__(self) -> str:
        return (
            f"Stream({self.dataref!r}, order={self.order!r}, offset={self.offset}, "
            f"batch_size={self.batch_size}, num_workers={self.num_workers})"
        )

    # --- positions: the public arithmetic adapters build on ---

    def locate(self, offset: int) -> tuple[int, int]:
        """(epoch, position) of a ``start_offset``: positions count from the first epoch's
        start (``global_start``'s place in it, if any)."""
        return self.order.locate(check_int("offset", offset, 0))

    def offset_of(self, epoch: int, position: int) -> int:
        """The ``start_offset`` of this shard's ``position`` in ``epoch`` (``locate``'s inverse)."""
        return self.order.offset_of(epoch, position)

    def epoch_length(self, epoch: int) -> int:
        """Positions of this shard in ``epoch``: ``positions_per_epoch``, or fewer in a first
        epoch begun part-way by ``global_start``."""
        return self.order.epoch_shard_length(epoch)

    def items_from(self, epoch: int, position: int) -> int:
        """Items (records, windows or batches) an iteration of ``epoch`` begun at ``position``
        hands out; with a predicate, an upper bound."""
        left = max(self.epoch_length(epoch) - position, 0)
        if self.batch_size is None:
            return left
        return left // self.batch_size if self.drop_last else -(-left // self.batch_size)

    def order_indices(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """What the order puts at this shard's positions [start, stop) of ``epoch``: record
        indices (indices of n-gram windows with ``ngram=``), clipped to the epoch."""
        return self.order.indices(epoch, start, stop)

    @property
    def offset(self) -> int:
        """The start_offset that resumes right after the last item handed out."""
        return self.offset_of(self._epoch, self._position)

    @property
    def global_offset(self) -> int:
        """The global_start that resumes right after the last item handed out, on any number of
        shards: exact when every shard has handed out as many positions as this one."""
        if not isinstance(self.order, EpochOrder):
            raise ValueError(
                "a stream with shard_by='chunks' has no global order: resume it with start_offset "
                "on the same number of shards"
            )
        return self.order.global_offset(self._epoch, self._position)

    def state(self) -> StreamState:
        """Where the stream is (``offset``) and what it was made with, checked by
        ``load_state``: see StreamState. ``state().to_dict()`` is JSON for a checkpoint."""
        return self.state_at(self.offset)

    def state_at(self, offset: int) -> StreamState:
        """This stream's state with ``offset`` (an ``offset_after`` count, for consumers that
        read ahead)."""
        if self.mixture is not None:
            dataset, fingerprint = self.mixture.identity()
        else:
            ref = cast("DataRef", self.dataref)
            dataset = f"{ref.dataset_id}:{ref.version}"
            fingerprint = build_fingerprint(ref.manifest)
        return StreamState(
            dataset=dataset,
            fingerprint=fingerprint,
            positions=self.num_positions,
            order=order_identity(self.settings),
            ngram=repr(self.ngram) if self.ngram is not None else None,
            offset=check_int("offset", offset, 0),
        )

    def load_state(self, state: StreamState | Mapping[str, Any]) -> None:
        """Resume where ``state`` (from ``state()``, or its ``to_dict()``) says: the next
        ``iter()`` starts at its offset. ValueError, naming what differs, if it was saved from a
        stream whose offsets mean other records (another version or build, order, seed,
        shards or n-gram)."""
        if not isinstance(state, StreamState):
            state = StreamState.from_dict(state)
        state.check_loads_into(self.state())
        self.seek(state.offset)

    def offset_after(self, epoch: int, items: int | None = None) -> int:
        """The start_offset that resumes right after the first ``items`` items this stream
        handed out in its iteration of ``epoch`` (None: after the whole epoch).

        For consumers that read ahead (tf.data's prefetch, a queue): count the items you
        consumed in an epoch and map the count to the exact resume point, with or without a
        predicate. ``epoch`` is the stream's own epoch number (``next_epoch_position[0]``
        before that epoch's ``iter()``); the last three iterations can be asked about.
        Counting past the end of an epoch that was read to its end means the whole epoch (a
        count of records in batches of ``B`` may overshoot in the last batch).
        """
        epoch = check_int("epoch", epoch, 0)
        length = self.epoch_length(epoch)
        if items is None:
            return self.offset_of(epoch, length)
        items = check_int("items", items, 0)
        ledger = next((led for led in reversed(self._ledgers) if led.epoch == epoch), None)
        if ledger is None:
            kept = [led.epoch for led in self._ledgers]
            raise ValueError(
                f"this stream has not iterated epoch {epoch} (it remembers the iterations of "
                f"epochs {kept}): pass the epoch whose items were counted, as "
                "stream.next_epoch_position[0] read before that epoch's iter()"
            )
        if items <= ledger.count:
            return self.offset_of(epoch, ledger.end_of(items))
        if ledger.finished:
            return self.offset_of(epoch, length)
        raise ValueError(
            f"{items} items of epoch {epoch} counted, but the stream has handed out only "
            f"{ledger.count} of that epoch so far: count only items you received"
        )

    def seek(self, offset: int) -> None:
        """Make the next ``iter()`` start at ``start_offset=offset``, as a stream made with it
        would (where a restored checkpoint says to resume)."""
        self._next = self.locate(check_int("offset", offset, 0))
        self._advance(*self._next)

    def _advance(self, epoch: int, position: int) -> None:
        self._epoch, self._position = epoch, position

    def __len__(self) -> int:
        """Items (records, windows or batches) in one whole epoch of this shard; with a
        predicate, an upper bound."""
        positions = self.positions_per_epoch
        if self.batch_size is None:
            return positions
        return positions // self.batch_size if self.drop_last else -(-positions // self.batch_size)

    # --- iteration ---

    # --- where the time goes ---

    def stats(self) -> StreamStats:
        """Items and bytes handed out, items/s, and the seconds spent reading, decoding, in
        predicates, in transforms, batching, waiting on workers and in the consumer, since
        the stream first began an epoch or since ``reset_stats()`` (see StreamStats)."""
        handing = self._handing
        extra = 0
        if handing is not None:  # records handed out of the block being handed out
            extra = int(np.searchsorted(handing, self._position, side="right"))
        return self._stats.snapshot(extra)

    def reset_stats(self) -> None:
        """Count ``stats()`` from now."""
        self._stats.reset()
        self._stats.begin()

    def begin_stats(self) -> None:
        """Start the clock of ``stats()``, if it has not started: adapters that read with
        ``read_unit`` call it as an epoch starts (iterating the stream does it itself)."""
        self._stats.begin()

    def count_read(self, read: Block, batches: int, seconds: float, waited: bool) -> None:
        """For adapters that read with ``read_unit`` (in their own workers): count the items
        of ``read`` (a Block whose ``ends``, ``work`` and ``nbytes`` are those of the blocks
        read) handed out, in ``batches``, and the ``seconds`` the consuming thread spent
        getting them (waiting for a worker when ``waited``)."""
        self._stats.add_block(len(read), read.nbytes, read.work, seconds, waited)
        self._stats.handed(len(read), batches)

    # --- iteration ---

    def __iter__(self) -> Iterator[Any]:
        self._stats.begin()
        epoch, position = self._next
        self._next = (epoch + 1, 0)  # the next iter() is the next epoch, finished or not
        ledger = Ledger(epoch, position)
        self._ledgers.append(ledger)
        if self.batch_size is None:
            return self._items(epoch, position, ledger)
        return self._batches(epoch, position, ledger)

    def iter_blocks(self) -> Iterator[Block]:
        """The next epoch as ``iter()`` would hand it out (same items, order, offsets and
        ledger), a block of records at a time: columns (field -> array or list) without a
        transform, else the list of items. For adapters that hand records over in bulk."""
        if self.batch_size is not None:
            raise ValueError("iter_blocks() is for record streams; this stream batches")
        self._stats.begin()
        epoch, position = self._next
        self._next = (epoch + 1, 0)
        ledger = Ledger(epoch, position)
        self._ledgers.append(ledger)
        return self._handed_blocks(epoch, position, ledger)

    def close(self) -> None:
        """Stop worker threads or processes now (they start again on the next iteration)."""
        if self._pool is not None:
            self._pool.close()

    @property
    def next_epoch_position(self) -> tuple[int, int]:
        """(epoch, position) where the next iter() starts."""
        return self._next

    def read_unit(self, epoch: int, start: int, stop: int) -> Block:
        """The block of this shard's positions [start, stop) of ``epoch``, read at the boundary
        (predicate, decode, transform): what adapters hand to their own workers. Records come
        as items, batches as columns where there is no transform."""
        block = self._reader((start, self._cached_units(epoch, start, stop)))
        return as_items(block) if self.batch_size is None else block

    def _cached_units(self, epoch: int, start: int, stop: int) -> Any:
        """What the reader takes for positions [start, stop), sliced from a block computed for
        many positions at once (the order costs per call; adapters ask one item at a time)."""
        cached = self._order_cache
        if cached is None or cached[0] != epoch or not cached[1] <= start <= stop <= cached[2]:
            length = self.order.epoch_shard_length(epoch)
            end = min(max(stop, start + 4 * _ORDER_BLOCK), length)
            located = self._located(epoch, self.order.indices(epoch, start, end))
            cached = self._order_cache = (epoch, start, end, located)
        return cached[3][start - cached[1] : stop - cached[1]]

    def _units(self, epoch: int, position: int, unit: int) -> Iterator[tuple[int, Any]]:
        """(first position, what the reader takes for them) of consecutive units of at most
        ``unit`` positions: their record indices, or for a mixture where they read.

        The order is computed for many units at once (it costs per call, not per position);
        record by record, the first unit is short so that the first record comes quickly.
        """
        length = self.order.epoch_shard_length(epoch)
        if self.batch_size is None and position < length:
            stop = min(position + min(_FIRST_BLOCK, unit), length)
            yield position, self._located(epoch, self.order.indices(epoch, position, stop))
            position = stop
        # (Where a mixture's positions read costs more per call than the order itself.)
        block = _ORDER_BLOCK if self.mixture is None else _MIXTURE_BLOCK
        span = max(unit, block // unit * unit)
        while position < length:
            stop = min(position + span, length)
            located = self._located(epoch, self.order.indices(epoch, position, stop))
            if self.mixture is not None:
                for k, run in enumerate(located.split(unit)):
                    yield position + k * unit, run
            else:
                for first in range(0, stop - position, unit):
                    yield position + first, located[first : first + unit]
            position = stop

    def _located(self, epoch: int, indices: np.ndarray) -> Any:
        """What the reader takes for positions whose order is ``indices``: those, or for a
        mixture where they read (a Located, sliced like the indices)."""
        if self.mixture is None:
            return indices
        seed = self.settings.seed or 0
        return self.mixture.locate(epoch, indices, self.settings.shuffle, seed)

    def _blocks(self, epoch: int, position: int) -> Iterator[Block]:
        unit = self._read_block if self.batch_size is None else self.batch_size
        if self.predicate is not None:
            # Batches fill from passing records across units; a unit of one batch's positions
            # would leave each unit's fixed cost to a handful of passing records.
            unit = max(unit, self._read_block)
        if self._pool is not None and self.transform is None:
            # (A transform's work dwarfs the hand-over, and its output may be far bigger than
            # the records: units stay a batch, so that memory and the first batch's wait do.)
            unit = max(unit, unit * (self._pool_unit // unit))
        units = self._units(epoch, position, unit)
        if self._read_ahead:
            units = self._announced(units)
        if self._pool is None:
            return self._timed(map(self._reader, units), waited=False)
        return self._timed(self._pool.map(units), waited=True)

    def _timed(self, blocks: Iterator[Block], waited: bool) -> Iterator[Block]:
        """``blocks``, each counted in the stats with the time it took to arrive."""
        stats = self._stats
        while True:
            began = perf_counter()
            block = next(blocks, None)
            if block is None:
                return
            stats.add_block(len(block), block.nbytes, block.work, perf_counter() - began, waited)
            yield block

    def _announced(self, units: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
        """``units``, each announced to the DataRef (``read_ahead``) about ``_read_ahead``
        positions before it is read: a cold disk reads their pages meanwhile
        (cache/readahead.py), a version read on demand fetches their chunks. N-gram windows
        announce their anchor records."""
        queued: deque[tuple[int, Any]] = deque()
        positions = 0
        for unit in units:
            indices = unit[1]
            self._reader.read_ahead(indices)
            queued.append(unit)
            positions += len(indices)
            while queued and positions - len(queued[0][1]) >= self._read_ahead:
                positions -= len(queued[0][1])
                yield queued.popleft()
        yield from queued

    def _epoch_done(self, epoch: int, ledger: Ledger) -> None:
        self._advance(epoch, self.order.epoch_shard_length(epoch))
        ledger.finished = True

    def _items(self, epoch: int, position: int, ledger: Ledger) -> Iterator[Any]:
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
            self._stats.handed(len(items))
        self._epoch_done(epoch, ledger)

    def _handed_blocks(self, epoch: int, position: int, ledger: Ledger) -> Iterator[Block]:
        for block in self._blocks(epoch, position):
            if len(block):
                ledger.add(block.ends)
                self._advance(epoch, int(block.ends[-1]))
                self._stats.handed(len(block))
                yield block
        self._epoch_done(epoch, ledger)

    def _batches(self, epoch: int, position: int, ledger: Ledger) -> Iterator[Any]:
        size = self.batch_size
        assert size is not None
        stats = self._stats
        pending: list[Block] = []
        count = 0
        for block in self._blocks(epoch, position):
            pending.append(block)
            count += len(block)
            while count >= size:
                began = perf_counter()
                batch, end, pending = _take(pending, size)
                stats.add_batching(perf_counter() - began)
                count -= size
                ledger.add_one(end)
                self._advance(epoch, end)
                stats.handed(size, 1)
                yield batch
        if count and not self.drop_last:
            batch, end, _ = _take(pending, count)
            ledger.add_one(end)
            self._advance(epoch, end)
            stats.handed(count, 1)
            yield batch
        self._epoch_done(epoch, ledger)

    @property
    def record_bytes(self) -> float:
        """The bytes a record takes in the chunk files, on average (at least 1)."""
        return self._record_bytes

    @property
    def datarefs(self) -> tuple[DataRef, ...]:
        """The DataRefs this stream reads: its own, or a mixture's sources'."""
        return self._reader.datarefs


def _is_mixture(source: Any) -> TypeGuard[Mixture]:
    # Known by what it does, not by its class: stream.py imports nothing of mixture.py (a
    # Mixture makes Streams, so that import would close a cycle).
    return hasattr(source, "leaves") and hasattr(source, "locate")


def _check_mixture_options(settings: OrderSettings, ngram: Any) -> None:
    """What a stream over a mixture cannot do, said before it starts."""
    if ngram is not None:
        raise ValueError(
            "ngram= windows run within one dataset: make the n-gram streams of the sources "
            "themselves, not of a mixture"
        )
    if settings.shard_by == "chunks":
        raise ValueError(
            "shard_by='chunks' keeps each shard's reads within whole chunks, which a mixture's "
            "slots do not map to: use shard_by='records' (the default) with a mixture"
        )
    if settings.shuffle_window is not None:
        raise ValueError(
            "shuffle_window= shuffles within windows of one dataset's chunks; a mixture's "
            "epoch is shuffled whole (leave shuffle_window=None)"
        )


def _mixture_fields(mixture: Mixture, fields: Any, batching: bool) -> tuple[Field, ...]:
    """The fields a mixture stream's items share: batches need the selected ones alike in
    every source (SchemaError otherwise); records may differ between sources, and then
    only the fields alike in all are listed (what adapters build their structure from)."""
    if batching or fields is not None:
        return mixture.batch_fields(fields)
    return mixture.shared_fields()


def _mixture_reader(
    mixture: Mixture,
    settings: OrderSettings,
    fields: Any,
    shared: tuple[Field, ...],
    predicate: Any,
    transform: Any,
    batching: bool,
    as_columns: bool,
) -> MixtureReader:
    """A reader per source, each with that source's fields: those named, or for batches the
    shared ones; records read record by record keep each source's own fields."""
    readers = []
    for leaf in mixture.leaves:
        if leaf.used:
            try:
                _check_boundary(leaf.ref, settings, fields, predicate, None)
            except SchemaError as exc:
                raise SchemaError(f"source {leaf.name!r}: {exc}") from None
        # (A source never read, of weight 0, gets a reader only to hold its place.)
        own = (fields is None and not batching) or not leaf.used
        chosen = leaf.ref.select(None if own else [f.name for f in shared])
        readers.append(
            BlockReader(
                leaf.ref, chosen, predicate=predicate, transform=transform, as_columns=as_columns
            )
        )
    return MixtureReader(mixture, readers, as_columns)


def _record_bytes(dataref: DataRef | Mixture) -> float:
    """The bytes a record takes in the chunk files, on average (at least 1)."""
    if _is_mixture(dataref):
        return max(_record_bytes(leaf.ref) for leaf in dataref.leaves)
    chunks = cast("DataRef", dataref).manifest.chunks
    records = sum(c.records for c in chunks)
    return max(1.0, sum(c.bytes for c in chunks) / records) if records else 1.0


def _chunk_bytes(dataref: DataRef | Mixture) -> float:
    """The bytes of a chunk file, on average (of the smallest-chunked source of a mixture)."""
    if _is_mixture(dataref):
        return min(_chunk_bytes(leaf.ref) for leaf in dataref.leaves)
    chunks = cast("DataRef", dataref).manifest.chunks
    return max(1.0, sum(c.bytes for c in chunks) / len(chunks)) if chunks else 1.0


def _check_worker_options(prefetch: int | None, worker_type: str) -> None:
    if prefetch is not None:
        check_int("prefetch", prefetch, 1)
    if worker_type not in WORKER_TYPES:
        raise ValueError(f"worker_type must be one of {WORKER_TYPES}, got {worker_type!r}")


def _check_boundary(
    dataref: DataRef,
    settings: OrderSettings,
    fields: Sequence[str] | str | None,
    predicate: Any,
    ngram: Any,
) -> None:
    """ValueError for a predicate or n-gram that is not one, or that this stream cannot take;
    SchemaError for fields they name that the dataset lacks."""
    if predicate is not None and not isinstance(predicate, Predicate):
        raise ValueError(
            "predicate must be made with ydl.predicates (in_set, in_lambda, ...), "
            f"got {predicate!r}"
        )
    if ngram is not None:
        if not isinstance(ngram, NGram):
            raise ValueError(f"ngram must be a ydl.NGram, got {ngram!r}")
        if fields is not None:
            raise ValueError("with ngram=, the NGram names the fields of each offset: drop fields=")
        if predicate is not None:
            raise ValueError("predicate= and ngram= cannot be combined in one stream")
        if settings.shard_by == "chunks":
            raise ValueError(CHUNK_SHARDS_TAKE_NO_GLOBAL_ORDER)
        ngram.check(dataref.schema)
    if predicate is not None:
        predicate.check(dataref.schema)


def _take(blocks: list[Block], n: int) -> tuple[Any, int, list[Block]]:
    """The first ``n`` items of ``blocks`` as one batch, the position after the last of them,
    and the blocks left over."""
    taken: list[Block] = []
    left = n
    rest = list(blocks)
    while left:
        block = rest.pop(0)
        if len(block) <= left:
            taken.append(block)
            left -= len(block)
        else:
            taken.append(_slice(block, 0, left))
            rest.insert(0, _slice(block, left, len(block)))
            left = 0
    end = int(taken[-1].ends[-1])
    if taken[0].columns is not None:
        columns = [b.columns for b in taken if len(b) and b.columns is not None]
        return _concat(columns) if len(columns) > 1 else columns[0], end, rest
    items = [item for b in taken for item in (b.items or [])]
    return collate(items), end, rest


def _slice(block: Block, start: int, stop: int) -> Block:
    if block.columns is not None:
        return Block(block.ends[start:stop], columns=_slice_columns(block.columns, start, stop))
    assert block.items is not None
    return Block(block.ends[start:stop], items=block.items[start:stop])


def _slice_columns(columns: dict[Any, Any], start: int, stop: int) -> dict[Any, Any]:
    return {
        k: _slice_columns(v, start, stop) if isinstance(v, dict) else v[start:stop]
        for k, v in columns.items()
    }


def _concat(parts: list[dict[Any, Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, first in parts[0].items():
        values = [p[key] for p in parts]
        if isinstance(first, dict):
            out[key] = _concat(values)
        elif isinstance(first, np.ndarray):
            out[key] = np.concatenate(values)
        else:
            out[key] = [v for part in values for v in part]
    return out
