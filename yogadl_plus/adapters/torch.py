"""PyTorch faces over DataRef and Stream: ``ydl.torch``.

- ``RecordDataset``: map-style, ``ds[i]`` is record ``i`` (and ``__getitems__`` fetches a batch
  of indices in one read), picklable into DataLoader workers.
- ``StreamSampler``: the record indices of ``dataref.stream(...)``'s order, for a plain
  DataLoader over a RecordDataset.
- ``make_dataloader``: a DataLoader over a stream's items whose ``state_dict()`` resumes at the
  next item exactly, with any number of workers. Items are computed from (epoch, position)
  alone, so a resume recomputes what workers had prefetched instead of snapshotting anything.

Its workers hand items over a group at a time (each DataLoader message costs a fixed ~0.2 ms,
more than a batch of small records takes to read), and put the arrays of large groups in a
shared-memory ring of their own (stream/workers/ring.py) instead of pickling them through the
DataLoader's one result pipe.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from yogadl_plus.adapters.keras_build import (
    a_thread_builds_the_model,
    makes_an_iterator_to_drop,
    unmoved,
    until_an_empty_epoch,
)
from yogadl_plus.checks import check_int
from yogadl_plus.columns import collate, records
from yogadl_plus.mixture import Mixture
from yogadl_plus.order import OrderSettings, shard_order
from yogadl_plus.stream import StreamState
from yogadl_plus.stream.batching import take
from yogadl_plus.stream.block import Block
from yogadl_plus.stream.stats import add_work
from yogadl_plus.stream.workers.child import ParentWatch, keep_freed_memory, skip_inherited_objects
from yogadl_plus.stream.workers.remote import error_payload, raised_from
from yogadl_plus.stream.workers.ring import Packed, SharedRing

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef
    from yogadl_plus.stream import Stream, StreamPlan, StreamStats
    from yogadl_plus.stream.stats import StatsCounter

__all__ = ["RecordDataset", "ResumableDataLoader", "StreamSampler", "make_dataloader"]

# A loader with workers hands over at most this many positions' items in one message, and
# about this many bytes (as the cache stores them) when its items are small.
_GROUP_POSITIONS = 4096
_GROUP_BYTES = 1 << 20


class RecordDataset(Dataset):
    """Map-style dataset over a DataRef: ``ds[i]`` is record ``i`` (its selected fields)."""

    def __init__(
        self,
        dataref: DataRef,
        fields: Sequence[str] | str | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        _refuse_mixture("RecordDataset", dataref)
        self.dataref = dataref
        self.fields = dataref.select(fields)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataref)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Records at ``indices``, read and decoded together (DataLoader uses this)."""
        checked = self.dataref.check_indices(indices)
        items = records(self.dataref.read_columns(checked, self.fields), len(checked))
        if self.transform is not None:
            items = [self.transform(r) for r in items]
        return items


class StreamSampler(Sampler[int]):
    """Record indices in exactly ``dataref.stream(...)``'s order, epoch after epoch.

    Each ``iter()`` is the next epoch; ``set_epoch(e)`` picks the epoch of the next ``iter()``
    (as DistributedSampler does). ``start_offset`` counts this shard's positions from epoch 0,
    as for streams; ``shuffle_window`` is the stream's windowed shuffle. An iteration Keras
    makes only to drop it (``model.fit`` of a DataLoader with this sampler reads a batch to
    build the model, and with workers makes each next epoch's iterator twice) hands out what
    the next one will, and the epoch stays.
    """

    def __init__(
        self,
        dataref: DataRef,
        shuffle: bool = False,
        shuffle_seed: int | None = None,
        shard_rank: int = 0,
        num_shards: int = 1,
        drop_shard_remainder: bool = False,
        start_offset: int = 0,
        skip_shuffle_at_epoch_end: bool = False,
        shuffle_window: int | None = None,
        pad_shard_remainder: bool = False,
        *,
        allow_uneven_shards: bool = False,
    ) -> None:
        settings = OrderSettings(
            shuffle=shuffle, shuffle_seed=shuffle_seed, shard_rank=shard_rank,
            num_shards=num_shards, drop_shard_remainder=drop_shard_remainder,
            pad_shard_remainder=pad_shard_remainder,
            start_offset=start_offset, skip_shuffle_at_epoch_end=skip_shuffle_at_epoch_end,
            shuffle_window=shuffle_window,
        ).seeded()  # fmt: skip
        _refuse_mixture("StreamSampler", dataref)
        self.order = shard_order(settings, len(dataref), dataref.chunk_records)
        _refuse_uneven_shards(
            "StreamSampler",
            self.order.shard_lengths,
            self.order.positions.first_epoch,
            allow_uneven_shards,
        )
        self.shuffle_seed = settings.shuffle_seed
        self._start = self.order.positions.position_of(settings.start_offset)
        self._epoch = self._start[0]

    def set_epoch(self, epoch: int) -> None:
        self._epoch = check_int("epoch", epoch, 0)

    def __len__(self) -> int:
        return self.order.shard_length

    def __iter__(self) -> Iterator[int]:
        epoch = self._epoch
        if a_thread_builds_the_model() or makes_an_iterator_to_drop(inspect.currentframe()):
            # Keras drops this iteration (see keras_build): it gets what the next one will,
            # and the epoch stays.
            yield from until_an_empty_epoch(map(self._indices, itertools.count(epoch)))
            return
        self._epoch = epoch + 1
        yield from self._indices(epoch)

    def _indices(self, epoch: int) -> Iterator[int]:
        """The record indices of ``epoch``, from the start position in the epoch begun at."""
        position = self._start[1] if epoch == self._start[0] else 0
        length = self.order.epoch_length(epoch)
        for start in range(position, length, 4096):
            yield from self.order.indices(epoch, start, min(start + 4096, length)).tolist()


@dataclass
class _Group:
    """What a worker hands over for one key: its items (or where they lie in the worker's
    ring), and the error raised on the item after them, if one was. A filtered stream's
    group holds ``blocks`` of the passing records instead, which the loader cuts into
    batches."""

    items: list[Any] | None = None
    packed: Packed | None = None
    ring: int = 0
    error: bytes | None = None
    read: Block = dataclasses.field(default_factory=lambda: Block(np.zeros(0, np.int64)))
    #: Whether its items are numpy (made tensors by the loader), not a collate_fn's.
    arrays: bool = True
    blocks: bool = False
    #: Pinned memory was asked for (``pin_memory=True``) and is left to the loader: items
    #: that are still in a ring or still blocks are pinned once they are tensors.
    pin: bool = False

    def pin_memory(self, device: Any = None) -> _Group:
        """The items as tensors in pinned memory (DataLoader's ``pin_memory=True``, in its
        pinning thread); the loader pins what this cannot."""
        if self.items is None or self.blocks:
            return dataclasses.replace(self, pin=True)
        items = [_to_tensors(item) for item in self.items] if self.arrays else self.items
        return dataclasses.replace(self, items=[_pinned(item) for item in items])


class _StreamItems(Dataset):
    """Key ``(epoch, start, count, iteration)``: the stream's ``count`` items from position
    ``start`` on, each through ``collate`` (the user's collate_fn) when there is one, for the
    loader's ``iteration``-th iteration (the tag of the ring parts it takes)."""

    def __init__(self, plan: StreamPlan, unit: int, collate: Callable[[Any], Any] | None) -> None:
        self.plan = plan
        self.unit = unit
        self.collate = collate
        # One per worker, made by the loader before it starts them (see SharedRing).
        self.rings: list[SharedRing | None] = []
        self._decoding_into: SharedRing | None = None

    def __getitem__(self, key: tuple[int, int, int, int]) -> _Group:
        worker = get_worker_info()
        ring = self._ring(worker)
        epoch, start, count, iteration = key
        if ring is not None:
            ring.tag = iteration
        items: list[Any] = []
        # What reading took (stream/stats.py), for the stream's stats() in the main process.
        read = Block(np.zeros(0, np.int64))
        arrays, blocks = self.collate is None, self.plan.boundary.filtered
        try:
            self._read(epoch, start, count, items, read)
        except Exception as exc:
            if worker is None:
                raise
            # The items before the one that failed are handed out first, as without workers.
            return _Group(items, error=error_payload(exc), read=read, arrays=arrays, blocks=blocks)
        if ring is not None and worker is not None and self.collate is None:
            packed = ring.pack(items)
            return _Group(packed=packed, ring=worker.id, read=read, arrays=arrays, blocks=blocks)
        return _Group(items, read=read, arrays=arrays, blocks=blocks)

    def _ring(self, worker: Any) -> SharedRing | None:
        """This worker's ring (None outside workers), which its decoder writes into."""
        if worker is None or worker.id >= len(self.rings):
            return None
        ring = self.rings[worker.id]
        if ring is not None and ring is not self._decoding_into and self.collate is None:
            self.plan.decode_into(ring.empty)
            self._decoding_into = ring
        return ring

    def __len__(self) -> int:
        return self.plan.positions_per_epoch

    def _read(self, epoch: int, start: int, count: int, out: list[Any], read: Block) -> None:
        """Read the key's items into ``out``, adding the work of the blocks to ``read``."""
        plan = self.plan

        def unit(first: int, stop: int) -> Block:
            block = plan.read(epoch, first, stop)
            read.ends = np.concatenate([read.ends, block.ends])
            add_work(read.work, block.work)
            read.nbytes += block.nbytes
            return block

        length = plan.epoch_length(epoch)
        stop = min(start + count * self.unit, length)
        if plan.boundary.filtered:
            # Blocks of the passing records: which make a batch depends on what passes before.
            try:
                out.append(_bare(unit(start, stop)))
            except Exception:  # read those before the record that fails, one by one
                for position in range(start, stop):
                    out.append(_bare(unit(position, position + 1)))
            return
        if plan.boundary.batch_size is None:
            try:
                items = unit(start, stop).items
            except Exception:
                items = None
            if items is None:  # find the record that fails, the ones before it read
                for position in range(start, stop):
                    out.append(self._finished(unit(position, position + 1)))
                return
            out.extend(items if self.collate is None else map(self.collate, items))
            return
        for first in range(start, stop, self.unit):
            out.append(self._finished(unit(first, min(first + self.unit, stop))))

    def _finished(self, block: Block) -> Any:
        if self.plan.boundary.batch_size is None:
            item = block.items[0]  # type: ignore[index]
        elif block.columns is not None:
            item = block.columns
        else:
            item = collate(block.items) if block.items else {}
        return item if self.collate is None else self.collate(item)


@dataclass
class _Cursor:
    """Where a loader's next item starts; shared with its sampler (not the loader itself:
    a loader <-> sampler cycle would leave the workers' shutdown to the cycle collector).
    Its sampler's keys step by ``unit`` positions: an item's (a record's or a batch's), or
    in a filtered stream a read's, whose passing records the loader cuts into batches."""

    plan: StreamPlan
    unit: int
    epoch: int
    position: int
    iteration: int = 0  # the loader's iterations begun so far

    @property
    def whole_units(self) -> bool:
        """Whether only whole units are read: batches of positions with ``drop_last``."""
        boundary = self.plan.boundary
        return boundary.drop_last and boundary.batch_size is not None and not boundary.filtered


class _PositionSampler(Sampler[tuple[int, int, int, int]]):
    """(epoch, position, units, iteration) of each group of ``group`` units of one epoch,
    from the cursor's place on."""

    def __init__(self, cursor: _Cursor, group: int) -> None:
        self.cursor = cursor
        self.group = group

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        cursor = self.cursor
        plan, unit, epoch, position = cursor.plan, cursor.unit, cursor.epoch, cursor.position
        length = plan.epoch_length(epoch)
        last = length - unit + 1 if cursor.whole_units else length
        starts = range(position, max(last, position), unit)
        for j in range(0, len(starts), self.group):
            yield epoch, starts[j], len(starts[j : j + self.group]), cursor.iteration

    def __len__(self) -> int:
        plan = self.cursor.plan
        units = (
            -(-plan.positions_per_epoch // self.cursor.unit)
            if plan.boundary.filtered
            else plan.items_per_epoch
        )
        return -(-units // self.group)


class ResumableDataLoader(DataLoader):
    """A DataLoader over a stream's items (see make_dataloader)."""

    def __init__(self, stream: Stream, allow_uneven_shards: bool = False, **kwargs: Any) -> None:
        for forbidden in ("sampler", "batch_sampler", "shuffle", "dataset"):
            if forbidden in kwargs:
                raise ValueError(
                    f"make_dataloader: {forbidden}= is not allowed: the order, shuffling and "
                    "sharding come from the stream"
                )
        self.stream = stream
        self.plan = plan = stream.plan()
        boundary = plan.boundary
        if boundary.batch_size is None and boundary.filtered:
            raise ValueError(
                "make_dataloader: a stream with a predicate or skip= must batch "
                "(batch_size=...): a record-by-record loader has no item to hand out for a "
                "record left out"
            )
        epoch, position = stream.next_epoch_position
        first_epoch = plan.position_of(0)[0]
        _refuse_uneven_shards("make_dataloader", plan.shard_items, first_epoch, allow_uneven_shards)
        if boundary.filtered:
            _refuse_filtered_shards(allow_uneven_shards)
        # A filtered stream's workers read runs of positions and hand over the records that
        # pass; this process fills the batches from them, as the stream does.
        unit = _filtered_unit(plan) if boundary.filtered else boundary.batch_size or 1
        self._cursor = _Cursor(plan, unit, epoch, position)
        self._worker_init = _WorkerInit(kwargs.pop("worker_init_fn", None))
        self._resume, self._after = True, epoch
        # Without a collate_fn of the user's, items are made tensors here, not in the workers:
        # tensors made there cross by shared-memory file descriptors, one socket round trip
        # each; arrays cross in the workers' rings (or pickled, when small).
        user_collate = kwargs.pop("collate_fn", None)
        self._convert: Callable[[Any], Any] | None = _to_tensors if user_collate is None else None
        # (A stream's item as this loader hands it out.)
        self._as_item: Callable[[Any], Any] = user_collate or _to_tensors
        # (Batches cut here are collated here.)
        self._collate_here = user_collate if boundary.filtered else None
        self._items = _StreamItems(plan, unit, None if boundary.filtered else user_collate)
        self._rings: list[SharedRing | None] | None = None
        group = _group_size(plan, unit) if kwargs.get("num_workers") else 1
        super().__init__(
            self._items,
            batch_size=None,
            sampler=_PositionSampler(self._cursor, group),
            collate_fn=_as_is,
            worker_init_fn=self._worker_init,
            **kwargs,
        )

    def __len__(self) -> int:
        return len(self.stream)

    def stats(self) -> StreamStats:
        """Where the loader's time went (``Stream.stats``): the boundary's work summed over
        the DataLoader workers, the time this process waited for them, and the rest, spent
        by the code consuming the items. ``reset_stats()`` counts from now."""
        return self.stream.stats()

    def reset_stats(self) -> None:
        self.stream.reset_stats()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # Each iter() is the next epoch, also after an unfinished one, as for streams; the first
        # iter() (or the first after load_state_dict) starts where the state says.
        cursor = self._cursor
        start = (cursor.epoch, cursor.position) if self._resume else (self._after, 0)
        if a_thread_builds_the_model():
            # Keras reads a batch or two of this iteration only to build the model (or to
            # learn their shapes), then drops it: it gets what the next one will hand out,
            # read here without the workers, and the loader's state stays.
            yield from map(self._as_item, unmoved(self.stream, self.plan.offset_of(*start)))
            return
        cursor.epoch, cursor.position = start
        self._resume, self._after = False, cursor.epoch + 1
        if self.num_workers:
            # Workers started by this iteration (if it starts any) end when this process does.
            self._worker_init.watch = ParentWatch.here(self._start_method())
        self.plan.begin_stats()
        rings = self._workers_rings()
        cursor.iteration += 1
        groups = super().__iter__()
        if self.persistent_workers:
            # Persistent workers were reset for this iteration: DataLoader dropped, unread,
            # what they had sent for the last one. Their ring parts are free again.
            for ring in rings:
                if ring is not None:
                    ring.reclaim(cursor.iteration)
        arrivals = _arrivals(groups, rings)
        if self.plan.boundary.filtered:
            yield from self._refilled(arrivals)
        else:
            yield from self._consecutive(arrivals)
        cursor.epoch, cursor.position = cursor.epoch + 1, 0

    def _start_method(self) -> str:
        context = self.multiprocessing_context
        if context is not None:
            return str(context.get_start_method())
        return (
            multiprocessing.get_start_method(allow_none=True)
            or multiprocessing.get_all_start_methods()[0]
        )

    def _consecutive(self, arrivals: Iterator[tuple[_Group, list[Any], float]]) -> Iterator[Any]:
        """The items of the groups as they are, each ``unit`` positions of the epoch."""
        cursor, plan, convert = self._cursor, self.plan, self._convert
        length = plan.epoch_length(cursor.epoch)
        batching = plan.boundary.batch_size is not None
        for group, items, waited in arrivals:
            plan.count_read(group.read, len(items) if batching else 0, waited, self._waits)
            pin = group.pin
            for item in items:
                cursor.position = min(cursor.position + cursor.unit, length)
                if convert is not None:
                    item = convert(item)
                yield _pinned(item) if pin else item
            self._raise_error(group)

    def _refilled(self, arrivals: Iterator[tuple[_Group, list[Any], float]]) -> Iterator[Any]:
        """A filtered stream's batches, filled from the passing records of the groups as the
        stream fills its own: all full but the epoch's last, none empty. Each moves the
        cursor to the position after its last record, where the stream's offset would be."""
        cursor, plan = self._cursor, self.plan
        boundary = plan.boundary
        assert boundary.batch_size is not None
        refill = _Refill(boundary.batch_size)
        pin = False
        for group, blocks, waited in arrivals:
            full = refill.add(blocks)
            plan.count_read(group.read, full, waited, self._waits)
            pin = group.pin
            for _ in range(full):
                batch, cursor.position = refill.batch(plan.stats)
                yield self._finished(batch, pin)
            self._raise_error(group)
        if refill.count and not boundary.drop_last:
            plan.stats.handed(0, 1)
            batch, cursor.position = refill.batch(plan.stats, refill.count)
            yield self._finished(batch, pin)

    @property
    def _waits(self) -> bool:
        """Whether the time to the next group is a wait for a worker."""
        return bool(self.num_workers)

    def _finished(self, batch: Any, pin: bool) -> Any:
        """A batch cut here, through the user's collate_fn or made tensors, pinned when asked."""
        if self._collate_here is not None:
            batch = self._collate_here(batch)
        elif self._convert is not None:
            batch = self._convert(batch)
        return _pinned(batch) if pin else batch

    def _raise_error(self, group: _Group) -> None:
        """The error a worker raised after the group's items, if it raised one."""
        if group.error is not None:
            cursor = self._cursor
            where = f"the item at position {cursor.position} of epoch {cursor.epoch}"
            raise raised_from(group.error, where.__str__)

    def _workers_rings(self) -> list[SharedRing | None]:
        """The rings of the workers that this iteration reads from: new ones for the workers
        it starts, those of the first iteration for persistent workers."""
        if not self.num_workers:
            return []
        if self.persistent_workers and self._rings is not None:
            return self._rings
        # Each worker process writes only its own ring: workers of an iteration left
        # unfinished may still be writing theirs.
        rings = [SharedRing.create() for _ in range(self.num_workers)]
        self._items.rings = rings  # the workers get them with the dataset as they start
        if self.persistent_workers:
            self._rings = rings
        return rings

    def state_dict(self) -> dict[str, Any]:
        """Where the next item starts; ``load_state_dict`` on a loader made the same way
        resumes there. ``offset`` is the same place as a stream's ``start_offset``; ``stream``
        is the stream's StreamState there (what the stream was made with, checked on load)."""
        cursor = self._cursor
        offset = self.plan.offset_of(cursor.epoch, cursor.position)
        return {
            "epoch": cursor.epoch,
            "position": cursor.position,
            "shuffle_seed": self.stream.shuffle_seed,
            "offset": offset,
            "stream": self.plan.state_at(offset).to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("shuffle_seed") != self.stream.shuffle_seed:
            raise ValueError(
                f"this loader's stream has shuffle_seed={self.stream.shuffle_seed}, the state "
                f"was saved with {state.get('shuffle_seed')}: make the stream with the same "
                "seed (and arguments) to resume"
            )
        if "stream" not in state:
            raise ValueError(
                "this loader state holds no stream state (an earlier release saved it): "
                f"resume with dataref.stream(start_offset={state.get('offset')!r}, ...)"
            )
        self.plan.check_state(StreamState.from_dict(state["stream"]))
        self._cursor.epoch = check_int("epoch", state["epoch"], 0)
        self._cursor.position = check_int("position", state["position"], 0)
        self._resume = True


def make_dataloader(
    stream: Stream,
    num_workers: int = 0,
    *,
    allow_uneven_shards: bool = False,
    **dataloader_kwargs: Any,
) -> Any:
    """A DataLoader handing out ``stream``'s items as torch tensors, resumable exactly.

    A batching stream gives batches (``batch_size=`` here sets the stream's batch size when it
    has none): a field of variable shape as a list of tensors, one per record (None for a
    nullable field's missing value); strings and bytes stay lists. An iteration Keras makes
    only to build the model (``model.fit(loader)``) reads what the next one will, without the
    workers, and moves nothing: Keras trains on the loader's next epoch first. Work runs in
    ``num_workers`` DataLoader workers. ``state_dict()`` after k consumed items, loaded into a
    loader made the same way, resumes at item k+1 with any ``num_workers``, persistent workers
    or not; one taken in the loop after an epoch's last item resumes that epoch, with nothing
    left in it, and one taken after the loop the next epoch (as torchdata's
    StatefulDataLoader). With a predicate or ``skip=``, the batches are the stream's (filled,
    none empty): the workers hand over the records that pass and this process fills the
    batches, running a ``collate_fn`` here.

    With workers, ``persistent_workers`` defaults to True (DataLoader's default is False):
    every iteration is the stream's next epoch, and starting the workers again for each one
    costs a fork of this whole process per worker (on short epochs of big records that made
    two workers slower than none). Pass ``persistent_workers=False`` to end them after each
    epoch.

    In a DDP job (``torch.distributed`` initialized, more than one process), a stream whose
    shards hand out different numbers of items is refused: the ranks with fewer would leave
    the others waiting in their last collective for ever. Make them equal with the stream's
    ``drop_shard_remainder=True`` or ``pad_shard_remainder=True`` (DistributedSampler's
    default), or pass ``allow_uneven_shards=True`` when the loop copes (``Join``).
    """
    batch_size = dataloader_kwargs.pop("batch_size", None)
    if batch_size is not None:
        if stream.batch_size is None:
            stream = stream.replace(batch_size=batch_size)
        elif batch_size != stream.batch_size:
            raise ValueError(
                f"make_dataloader: batch_size={batch_size} but the stream batches by "
                f"{stream.batch_size}; leave batch_size out"
            )
    if num_workers:
        dataloader_kwargs.setdefault("persistent_workers", True)
    return ResumableDataLoader(
        stream,
        allow_uneven_shards=allow_uneven_shards,
        num_workers=num_workers,
        **dataloader_kwargs,
    )


class _WorkerInit:
    """A DataLoader worker's start: watch the parent, then the user's ``worker_init_fn``.

    Without the watch, a worker outlived a parent that ended abruptly. Small groups of items
    are numpy arrays pickled through the workers' one result pipe, whose read end every worker
    holds too (forked with it): once the pipe is full, a worker's queue thread waits to write
    and its siblings' wait for the queue's lock, and exiting waits for those threads, for
    ever. Torch's own check of the parent comes between items and leads to that exit. (Large
    groups cross in the workers' rings, leaving little in the pipe.)

    It also has the worker keep the memory each group frees for the next (keep_freed_memory).
    """

    def __init__(self, user: Callable[[int], Any] | None) -> None:
        self.user = user
        self.watch: ParentWatch | None = None

    def __call__(self, worker_id: int) -> None:
        if self.watch is not None:
            self.watch.start()
        skip_inherited_objects()
        keep_freed_memory()
        if self.user is not None:
            self.user(worker_id)


def _refuse_uneven_shards(
    what: str, counts: Callable[[int], list[int]], first_epoch: int, allow: bool
) -> None:
    """ValueError in a DDP job whose shards hand out different numbers of items (``counts``
    of an epoch: per rank) in its first epoch, which may be begun part-way, or in the next."""
    if allow or not _distributed():
        return
    for epoch in (first_epoch, first_epoch + 1):
        per_rank = counts(epoch)
        if len(set(per_rank)) > 1:
            shown = " / ".join(f"{count:,}" for count in per_rank[:8])
            shown += " / ..." if len(per_rank) > 8 else ""
            raise ValueError(
                f"{what}: the {len(per_rank)} shards of this stream hand out {shown} items in "
                f"epoch {epoch}; in a DDP job (torch.distributed is initialized) the ranks with "
                "fewer would leave the others waiting in their last collective for ever. Make "
                "the shards equal in the stream: drop_shard_remainder=True (leave the last "
                "positions of each epoch out) or pad_shard_remainder=True (repeat the first "
                "ones, as DistributedSampler does); or pass allow_uneven_shards=True if your "
                "loop copes with uneven inputs (torch.distributed.algorithms.Join)"
            )


def _refuse_filtered_shards(allow: bool) -> None:
    """ValueError in a DDP job: a filtered stream's ranks hand out numbers of batches that
    depend on their records."""
    if allow or not _distributed():
        return
    raise ValueError(
        "make_dataloader: with a predicate or skip=, the number of batches each rank hands out "
        "depends on how many of its records pass (its batches are filled, none empty); in a "
        "DDP job (torch.distributed is initialized) the ranks with fewer would leave the "
        "others waiting in their last collective for ever. Pass allow_uneven_shards=True and "
        "join the ranks' loops (torch.distributed.algorithms.Join), or leave the records out "
        "when caching (the version then has only those that pass)"
    )


def _distributed() -> bool:
    """Whether this process is one of several in an initialized torch.distributed group."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _refuse_mixture(what: str, dataref: Any) -> None:
    if isinstance(dataref, Mixture):
        raise TypeError(
            f"{what} indexes one DataRef's records; which record a Mixture's position reads "
            "changes with the epoch: use make_dataloader(mix.stream(...)) for a mixture"
        )


def _as_is(item: Any) -> Any:
    return item


def _group_size(plan: StreamPlan, unit: int) -> int:
    """Items per worker message: all of _GROUP_POSITIONS positions, or fewer when their
    records (as stored) come to more than _GROUP_BYTES; at least one."""
    per_record = max(1, int(plan.source.record_bytes))
    return max(1, min(_GROUP_POSITIONS // unit, _GROUP_BYTES // (unit * per_record)))


def _filtered_unit(plan: StreamPlan) -> int:
    """Positions a filtered stream's worker reads at a time: a batch's at least, and as many
    as the stream reads at once (a run of one batch's positions may hold few that pass)."""
    batch_size = plan.boundary.batch_size
    assert batch_size is not None
    return max(batch_size, plan.sizes.read_block)


def _bare(block: Block) -> Block:
    """``block``'s records and their ends, to hand over (its work is counted apart)."""
    return Block(block.ends, items=block.items, columns=block.columns)


def _arrivals(
    groups: Iterator[_Group], rings: list[SharedRing | None]
) -> Iterator[tuple[_Group, list[Any], float]]:
    """Each group as it arrives, its items (unpacked from its worker's ring), and the seconds
    this process spent getting them."""
    while True:
        began = perf_counter()
        group = next(groups, None)
        if group is None:
            return
        if group.packed is not None:
            ring = rings[group.ring]
            assert ring is not None, "a worker without a ring sent items in one"
            items = ring.unpack(group.packed)
        else:
            assert group.items is not None
            items = group.items
        yield group, items, perf_counter() - began


class _Refill:
    """Batches of ``size`` records cut from blocks of records as they come, across block
    boundaries (``stream.batching.take``, which the stream cuts its own batches with)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pending: list[Block] = []
        self.count = 0  # records pending

    def add(self, blocks: list[Block]) -> int:
        """Take ``blocks`` in; how many full batches are pending now."""
        for block in blocks:
            if len(block):
                self.pending.append(block)
                self.count += len(block)
        return self.count // self.size

    def batch(self, stats: StatsCounter, n: int | None = None) -> tuple[Any, int]:
        """The next batch (of ``n`` records, a full one by default) and the position after its
        last record; the time cutting it took goes to ``stats``."""
        n = self.size if n is None else n
        began = perf_counter()
        batch, end, self.pending = take(self.pending, n)
        stats.add_batching(perf_counter() - began)
        self.count -= n
        return batch, end


def _pinned(item: Any) -> Any:
    if isinstance(item, torch.Tensor):
        return item.pin_memory()
    if isinstance(item, dict):
        return {k: _pinned(v) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return type(item)(_pinned(v) for v in item)
    return item


def _to_tensors(item: Any) -> Any:
    """numpy arrays and scalars to tensors, containers walked: a batch's list of arrays of
    different shapes (or of a nullable field's values) becomes a list of tensors, its None
    kept; lists of str or bytes are kept."""
    if isinstance(item, np.ndarray):
        return torch.from_numpy(item) if item.dtype.kind in _NUMERIC else item
    if isinstance(item, np.generic):
        return torch.as_tensor(item) if item.dtype.kind in _NUMERIC else item
    if isinstance(item, dict):
        return {k: _to_tensors(v) for k, v in item.items()}
    if isinstance(item, list) and _holds_numbers(item):
        return [_to_tensors(v) for v in item]
    return item


# The kinds of numpy dtype that torch has: bool, int, uint, float, complex.
_NUMERIC = "biufc"


def _holds_numbers(values: list[Any]) -> bool:
    """Whether a batch's list holds arrays or numpy scalars (its first value not None says:
    a field's values are alike)."""
    for value in values:
        if value is not None:
            return isinstance(value, (np.ndarray, np.generic))
    return False
