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
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from yogadl_plus.checks import check_int
from yogadl_plus.columns import collate, records
from yogadl_plus.mixture import Mixture
from yogadl_plus.order import OrderSettings, shard_order
from yogadl_plus.stream import StreamState
from yogadl_plus.stream.block import Block
from yogadl_plus.stream.stats import add_work
from yogadl_plus.stream.workers.child import ParentWatch, keep_freed_memory, skip_inherited_objects
from yogadl_plus.stream.workers.remote import error_payload, raised_from
from yogadl_plus.stream.workers.ring import Packed, SharedRing

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef
    from yogadl_plus.stream import Stream, StreamPlan, StreamStats

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
    as for streams; ``shuffle_window`` is the stream's windowed shuffle.
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
        self._epoch = epoch + 1
        position = self._start[1] if epoch == self._start[0] else 0
        length = self.order.epoch_length(epoch)
        for start in range(position, length, 4096):
            yield from self.order.indices(epoch, start, min(start + 4096, length)).tolist()


@dataclass
class _Group:
    """What a worker hands over for one key: its items (or where they lie in the worker's
    ring), and the error raised on the item after them, if one was."""

    items: list[Any] | None = None
    packed: Packed | None = None
    ring: int = 0
    error: bytes | None = None
    read: Block = dataclasses.field(default_factory=lambda: Block(np.zeros(0, np.int64)))

    def pin_memory(self, device: Any = None) -> _Group:
        """The items with their tensors in pinned memory (DataLoader's ``pin_memory=True``)."""
        if self.items is None:
            return self
        return _Group([_pinned(item) for item in self.items], error=self.error, read=self.read)


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
        try:
            self._read(epoch, start, count, items, read)
        except Exception as exc:
            if worker is None:
                raise
            # The items before the one that failed are handed out first, as without workers.
            return _Group(items, error=error_payload(exc), read=read)
        if ring is not None and worker is not None and self.collate is None:
            return _Group(packed=ring.pack(items), ring=worker.id, read=read)
        return _Group(items, read=read)

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
    a loader <-> sampler cycle would leave the workers' shutdown to the cycle collector)."""

    plan: StreamPlan
    unit: int
    epoch: int
    position: int
    iteration: int = 0  # the loader's iterations begun so far


class _PositionSampler(Sampler[tuple[int, int, int, int]]):
    """(epoch, position, items, iteration) of each group of ``group`` items of one epoch, from
    the cursor's place on."""

    def __init__(self, cursor: _Cursor, group: int) -> None:
        self.cursor = cursor
        self.group = group

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        cursor = self.cursor
        plan, unit, epoch, position = cursor.plan, cursor.unit, cursor.epoch, cursor.position
        length = plan.epoch_length(epoch)
        last = (
            length - unit + 1
            if plan.boundary.batch_size is not None and plan.boundary.drop_last
            else length
        )
        starts = range(position, max(last, position), unit)
        for j in range(0, len(starts), self.group):
            yield epoch, starts[j], len(starts[j : j + self.group]), cursor.iteration

    def __len__(self) -> int:
        return -(-self.cursor.plan.items_per_epoch // self.group)


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
        self._unit = 1 if plan.boundary.batch_size is None else plan.boundary.batch_size
        if plan.boundary.batch_size is None and plan.boundary.filtered:
            raise ValueError(
                "make_dataloader: a stream with a predicate or skip= must batch "
                "(batch_size=...): a record-by-record loader has no item to hand out for a "
                "record left out"
            )
        epoch, position = stream.next_epoch_position
        first_epoch = plan.position_of(0)[0]
        _refuse_uneven_shards("make_dataloader", plan.shard_items, first_epoch, allow_uneven_shards)
        self._cursor = _Cursor(plan, self._unit, epoch, position)
        self._worker_init = _WorkerInit(kwargs.pop("worker_init_fn", None))
        self._resume, self._after = True, epoch
        # Without a collate_fn of the user's, items are made tensors here, not in the workers:
        # tensors made there cross by shared-memory file descriptors, one socket round trip
        # each; arrays cross in the workers' rings (or pickled, when small).
        user_collate = kwargs.pop("collate_fn", None)
        self._convert: Callable[[Any], Any] | None = _to_tensors if user_collate is None else None
        self._items = _StreamItems(plan, self._unit, user_collate)
        self._rings: list[SharedRing | None] | None = None
        group = _group_size(plan, self._unit) if kwargs.get("num_workers") else 1
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
        if not self._resume:
            cursor.epoch, cursor.position = self._after, 0
        self._resume, self._after = False, cursor.epoch + 1
        plan = self.plan
        length = plan.epoch_length(cursor.epoch)
        convert = self._convert
        if self.num_workers:
            # Workers started by this iteration (if it starts any) end when this process does.
            context = self.multiprocessing_context
            method = (
                context.get_start_method()
                if context is not None
                else multiprocessing.get_start_method(allow_none=True)
                or multiprocessing.get_all_start_methods()[0]
            )
            self._worker_init.watch = ParentWatch.here(method)
        plan.begin_stats()
        rings = self._workers_rings()
        cursor.iteration += 1
        groups = super().__iter__()
        if self.persistent_workers:
            # Persistent workers were reset for this iteration: DataLoader dropped, unread,
            # what they had sent for the last one. Their ring parts are free again.
            for ring in rings:
                if ring is not None:
                    ring.reclaim(cursor.iteration)
        while True:
            began = perf_counter()
            group = next(groups, None)
            if group is None:
                break
            if group.packed is not None:
                ring = rings[group.ring]
                assert ring is not None, "a worker without a ring sent items in one"
                items = ring.unpack(group.packed)
            else:
                items = group.items
            batches = 0 if plan.boundary.batch_size is None else len(items)
            waited = perf_counter() - began
            plan.count_read(group.read, batches, waited, bool(self.num_workers))
            for item in items:
                cursor.position = min(cursor.position + self._unit, length)
                yield item if convert is None else convert(item)
            if group.error is not None:
                where = f"the item at position {cursor.position} of epoch {cursor.epoch}"
                raise raised_from(group.error, where.__str__)
        cursor.epoch, cursor.position = cursor.epoch + 1, 0

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
    has none); strings and bytes stay lists. Work runs in ``num_workers`` DataLoader workers.
    ``state_dict()`` after k consumed items, loaded into a loader made the same way, resumes at
    item k+1 with any ``num_workers``, persistent workers or not. With a predicate, each batch
    holds the passing records of one run of ``batch_size`` positions (it is not refilled).

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


def _pinned(item: Any) -> Any:
    if isinstance(item, torch.Tensor):
        return item.pin_memory()
    if isinstance(item, dict):
        return {k: _pinned(v) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return type(item)(_pinned(v) for v in item)
    return item


def _to_tensors(item: Any) -> Any:
    """numpy arrays and scalars to tensors, containers walked, str/bytes/lists kept."""
    if isinstance(item, np.ndarray):
        return torch.from_numpy(item) if item.dtype.kind in "biufc" else item
    if isinstance(item, np.generic):
        return torch.as_tensor(item) if item.dtype.kind in "biufc" else item
    if isinstance(item, dict):
        return {k: _to_tensors(v) for k, v in item.items()}
    return item
