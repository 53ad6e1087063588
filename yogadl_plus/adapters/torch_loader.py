"""A resumable PyTorch DataLoader over a stream's items: ``make_dataloader`` (the one to use),
which makes a ``ResumableDataLoader``. Its ``state_dict()`` resumes at the next item exactly,
with any number of workers: items are computed from (epoch, position) alone, so a resume
recomputes what workers had prefetched instead of snapshotting anything.

Without DataLoader workers, a stream with workers of its own reads the epochs for it, with
them. Otherwise it reads through the stream's plan (``stream.plan()``) and hands what its
workers read over through the stream's own hand-off (stream/workers/handoff.py): a group of
items at a time (each DataLoader message costs a fixed ~0.2 ms, more than a batch of small
records takes to read), the arrays of large groups in a shared-memory ring of each worker's
instead of pickled through the DataLoader's one result pipe.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from yogadl_plus.adapters.keras_build import a_thread_builds_the_model, unmoved
from yogadl_plus.adapters.torch_ddp import refuse_filtered_shards, refuse_uneven_shards
from yogadl_plus.checks import check_int
from yogadl_plus.stream.workers.handoff import (
    Parcel,
    ParentWatch,
    Refill,
    Sender,
    SharedRing,
    read_group,
    start_worker,
    worker_rings,
)

if TYPE_CHECKING:
    from yogadl_plus.stream import Stream, StreamPlan, StreamStats

__all__ = ["ResumableDataLoader", "make_dataloader"]

# A loader with workers hands over at most this many positions' items in one message, and
# about this many bytes (as the cache stores them) when its items are small.
_GROUP_POSITIONS = 4096
_GROUP_BYTES = 1 << 20


@dataclass
class _Group(Parcel):
    """What a worker hands over for one key (a ``Parcel``: its items or where they lie in the
    worker's ring, the error raised on the item after them, what reading took). A filtered
    stream's group holds ``blocks`` of the passing records instead, which the loader cuts
    into batches."""

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
        self._sender: Sender | None = None

    def __getitem__(self, key: tuple[int, int, int, int]) -> _Group:
        epoch, start, count, iteration = key
        sender = self._sender_here()
        if sender is not None:
            sender.tag(iteration)
        stop = min(start + count * self.unit, self.plan.epoch_length(epoch))
        # In a worker, the items before one that fails are handed out first, then its error,
        # as without workers.
        parcel = read_group(self.plan, epoch, start, stop, self.unit, self.collate, sender)
        filtered = self.plan.boundary.filtered
        return _Group(**vars(parcel), arrays=self.collate is None, blocks=filtered)

    def _sender_here(self) -> Sender | None:
        """This worker's side of the hand-off (None outside workers): over its ring, which its
        decoder writes into, unless a collate_fn of the user's makes the items."""
        worker = get_worker_info()
        if worker is None:
            return None
        ring = self.rings[worker.id] if worker.id < len(self.rings) else None
        if self.collate is not None:
            ring = None
        if self._sender is None or self._sender.ring is not ring:
            self._sender = Sender(ring, worker.id)
            self._sender.decode_into_ring(self.plan)
        return self._sender

    def __len__(self) -> int:
        return self.plan.positions_per_epoch


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
    #: The stream reading this epoch for the loader (see ResumableDataLoader._ahead), if one
    #: is: the cursor is then the place after the last item it handed out, asked for only
    #: when wanted (``settle``), which costs nothing per item.
    follows: Stream | None = None

    def move_to(self, epoch: int, position: int) -> None:
        self.epoch, self.position, self.follows = epoch, position, None

    def settle(self) -> None:
        """Take the place of the stream followed, if any (it keeps being followed)."""
        stream = self.follows
        if stream is None:
            return
        epoch, position = self.plan.position_of(stream.offset)
        if epoch != self.epoch:  # (by offset, an epoch's end is the next one's start)
            position = self.plan.epoch_length(self.epoch)
        self.position = position

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
        refuse_uneven_shards("make_dataloader", plan.shard_items, first_epoch, allow_uneven_shards)
        if boundary.filtered:
            refuse_filtered_shards(allow_uneven_shards)
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
        # Without DataLoader workers, a copy of the stream reads the epochs (ahead, with the
        # stream's workers if it has any): it reads units of several batches, where DataLoader
        # would fetch one item at a time.
        self._ahead = _reading_copy(stream) if not kwargs.get("num_workers") else None
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
        the DataLoader workers (or the stream's), the time this process waited for them, and
        the rest, spent by the code consuming the items. ``reset_stats()`` counts from now."""
        # (The copy reading ahead counts into the stream's stats, and knows the records it
        # handed out of a block.)
        return (self.stream if self._ahead is None else self._ahead).stats()

    def reset_stats(self) -> None:
        self.stream.reset_stats()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # Each iter() is the next epoch, also after an unfinished one, as for streams; the first
        # iter() (or the first after load_state_dict) starts where the state says.
        cursor = self._cursor
        cursor.settle()
        start = (cursor.epoch, cursor.position) if self._resume else (self._after, 0)
        if a_thread_builds_the_model():
            # Keras reads a batch or two of this iteration only to build the model (or to
            # learn their shapes), then drops it: it gets what the next one will hand out,
            # read here without the workers, and the loader's state stays.
            yield from map(self._as_item, unmoved(self.stream, self.plan.offset_of(*start)))
            return
        cursor.move_to(*start)
        self._resume, self._after = False, cursor.epoch + 1
        if self._ahead is not None:
            yield from self._read_ahead(self._ahead)
        else:
            yield from self._read_here_or_by_workers()
        cursor.move_to(cursor.epoch + 1, 0)

    def _read_ahead(self, ahead: Stream) -> Iterator[Any]:
        """The rest of the cursor's epoch as ``ahead`` (a copy of the stream, with its
        workers) hands it out from the cursor on, the cursor following it.

        The stream's workers read several items at a time and fail them together: after an
        error, the rest of the epoch is read here as without them, which hands out the items
        before the one that fails, then raises its error (a RuntimeWarning says so if reading
        here meets none: a worker process died, or could not send a result back)."""
        cursor = self._cursor
        if cursor.position >= self.plan.epoch_length(cursor.epoch):
            # (A state taken after the epoch's last item: nothing is left of it. Its offset
            # is also where the next epoch starts, which a seek would read.)
            return
        ahead.seek(self.plan.offset_of(cursor.epoch, cursor.position))
        cursor.follows = ahead
        # (Left unfinished, this iteration drops ``items`` with it, and their units in flight.)
        items = iter(ahead)
        pin = self.pin_memory and _pinning_is_on()
        while True:
            try:
                item = next(items)
            except StopIteration:
                return
            except Exception as error:
                failed = error
                break
            item = self._as_item(item)
            yield _pinned(item) if pin else item
        cursor.settle()
        cursor.follows = None
        yield from self._read_here_or_by_workers()
        warnings.warn(
            f"the stream's workers failed in epoch {cursor.epoch} ({type(failed).__name__}: "
            f"{failed}), and its rest was read without them, which met no error",
            RuntimeWarning,
            stacklevel=2,
        )

    def _read_here_or_by_workers(self) -> Iterator[Any]:
        """The rest of the cursor's epoch, read by the DataLoader's workers or, without any,
        here."""
        cursor = self._cursor
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
            group.count(plan, len(items) if batching else 0, waited, self._waits)
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
        refill = Refill(boundary.batch_size)
        pin = False
        for group, blocks, waited in arrivals:
            full = refill.add(blocks)
            group.count(plan, full, waited, self._waits)
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
        cursor = self._cursor
        group.raise_error(lambda: f"the item at position {cursor.position} of epoch {cursor.epoch}")

    def _workers_rings(self) -> list[SharedRing | None]:
        """The rings of the workers that this iteration reads from: new ones for the workers
        it starts, those of the first iteration for persistent workers."""
        if not self.num_workers:
            return []
        if self.persistent_workers and self._rings is not None:
            return self._rings
        # Each worker process writes only its own ring: workers of an iteration left
        # unfinished may still be writing theirs.
        rings = worker_rings(self.num_workers)
        self._items.rings = rings  # the workers get them with the dataset as they start
        if self.persistent_workers:
            self._rings = rings
        return rings

    def state_dict(self) -> dict[str, Any]:
        """Where the next item starts; ``load_state_dict`` on a loader made the same way
        resumes there. ``offset`` is the same place as a stream's ``start_offset``; ``stream``
        is the stream's StreamState there (what the stream was made with, checked on load)."""
        cursor = self._cursor
        cursor.settle()
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
        self.plan.check_state(state["stream"])
        epoch = check_int("epoch", state["epoch"], 0)
        self._cursor.move_to(epoch, check_int("position", state["position"], 0))
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
    ``num_workers`` DataLoader workers; with none, in the stream's own workers if it has any
    (``stream(num_workers=...)``: threads suit transforms that release the GIL), which read
    ahead for a copy of the stream that the loader keeps. ``state_dict()`` after k consumed
    items, loaded into a loader made the same way, resumes at item k+1 with any
    ``num_workers``, persistent workers or not; one taken in the loop after an epoch's last
    item resumes that epoch, with nothing left in it, and one taken after the loop the next
    epoch (as torchdata's StatefulDataLoader). With a predicate or ``skip=``, the batches are
    the stream's (filled, none empty): the workers hand over the records that pass and this
    process fills the batches, running a ``collate_fn`` here.

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
        start_worker(self.watch)
        if self.user is not None:
            self.user(worker_id)


def _as_is(item: Any) -> Any:
    return item


def _reading_copy(stream: Stream) -> Stream:
    """A copy of ``stream`` to read its epochs for a loader without workers, with the stream's
    own workers (kept across epochs, stopped when the copy is dropped with the loader),
    counting in the stream's stats; the stream itself does not move, as with workers."""
    copy = stream.replace()
    copy.plan().stats = stream.plan().stats
    return copy


def _pinning_is_on() -> bool:
    """Whether DataLoader pins what it hands out when asked to (there is a device to pin
    memory for)."""
    accelerator = getattr(torch, "accelerator", None)  # (torch 2.6 on)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return bool(torch.cuda.is_available())


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
        yield group, group.opened(rings), perf_counter() - began


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
