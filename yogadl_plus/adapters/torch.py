"""PyTorch faces over DataRef and Stream: ``ydl.torch``.

- ``RecordDataset``: map-style, ``ds[i]`` is record ``i`` (and ``__getitems__`` fetches a batch
  of indices in one read), picklable into DataLoader workers.
- ``StreamSampler``: the record indices of ``dataref.stream(...)``'s order, for a plain
  DataLoader over a RecordDataset.
- ``make_dataloader``: a DataLoader over a stream's items whose ``state_dict()`` resumes at the
  next item exactly, with any number of workers. Items are computed from (epoch, position)
  alone, so a resume recomputes what workers had prefetched instead of snapshotting anything.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from yogadl_plus.boundary import collate, records
from yogadl_plus.checks import check_int
from yogadl_plus.order import OrderSettings
from yogadl_plus.stream_state import StreamState
from yogadl_plus.workers import ParentWatch

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef
    from yogadl_plus.stream import Stream

__all__ = ["RecordDataset", "ResumableDataLoader", "StreamSampler", "make_dataloader"]


class RecordDataset(Dataset):
    """Map-style dataset over a DataRef: ``ds[i]`` is record ``i`` (its selected fields)."""

    def __init__(
        self,
        dataref: DataRef,
        fields: Sequence[str] | str | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
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
    as for streams.
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
    ) -> None:
        settings = OrderSettings(
            shuffle=shuffle, seed=shuffle_seed, shard_rank=shard_rank, num_shards=num_shards,
            drop_shard_remainder=drop_shard_remainder, start_offset=start_offset,
            skip_shuffle_at_epoch_end=skip_shuffle_at_epoch_end,
        ).seeded()  # fmt: skip
        self.order = settings.order(len(dataref), [c.records for c in dataref.manifest.chunks])
        self.shuffle_seed = settings.seed
        self._start = self.order.locate(settings.start_offset)
        self._epoch = self._start[0]

    def set_epoch(self, epoch: int) -> None:
        self._epoch = check_int("epoch", epoch, 0)

    def __len__(self) -> int:
        return self.order.shard_length

    def __iter__(self) -> Iterator[int]:
        epoch = self._epoch
        self._epoch = epoch + 1
        position = self._start[1] if epoch == self._start[0] else 0
        length = self.order.epoch_shard_length(epoch)
        for start in range(position, length, 4096):
            yield from self.order.indices(epoch, start, min(start + 4096, length)).tolist()


class _StreamItems(Dataset):
    """Item ``(epoch, position)``: the stream's item that starts at that position."""

    def __init__(self, stream: Stream, unit: int) -> None:
        self.stream = stream
        self.unit = unit

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, start = key
        stop = min(start + self.unit, self.stream.epoch_length(epoch))
        block = self.stream.read_unit(epoch, start, stop)
        if self.stream.batch_size is None:
            return block.items[0]  # type: ignore[index]
        if block.columns is not None:
            return block.columns
        return collate(block.items) if block.items else {}

    def __len__(self) -> int:
        return self.stream.positions_per_epoch


@dataclass
class _Cursor:
    """Where a loader's next item starts; shared with its sampler (not the loader itself:
    a loader <-> sampler cycle would leave the workers' shutdown to the cycle collector)."""

    stream: Stream
    unit: int
    epoch: int
    position: int


class _PositionSampler(Sampler[tuple[int, int]]):
    """(epoch, position) of each item of one epoch, from the cursor's place on."""

    def __init__(self, cursor: _Cursor) -> None:
        self.cursor = cursor

    def __iter__(self) -> Iterator[tuple[int, int]]:
        cursor = self.cursor
        stream, unit, epoch, position = cursor.stream, cursor.unit, cursor.epoch, cursor.position
        length = stream.epoch_length(epoch)
        last = length - unit + 1 if stream.batch_size is not None and stream.drop_last else length
        for start in range(position, max(last, position), unit):
            yield epoch, start

    def __len__(self) -> int:
        return len(self.cursor.stream)


class ResumableDataLoader(DataLoader):
    """A DataLoader over a stream's items (see make_dataloader)."""

    def __init__(self, stream: Stream, **kwargs: Any) -> None:
        for forbidden in ("sampler", "batch_sampler", "shuffle", "dataset"):
            if forbidden in kwargs:
                raise ValueError(
                    f"make_dataloader: {forbidden}= is not allowed: the order, shuffling and "
                    "sharding come from the stream"
                )
        self.stream = stream
        self._unit = 1 if stream.batch_size is None else stream.batch_size
        if stream.batch_size is None and stream.predicate is not None:
            raise ValueError(
                "make_dataloader: a stream with a predicate must batch (batch_size=...): a "
                "record-by-record loader has no item to hand out for a rejected record"
            )
        epoch, position = stream.next_epoch_position
        self._cursor = _Cursor(stream, self._unit, epoch, position)
        self._worker_init = _WorkerInit(kwargs.pop("worker_init_fn", None))
        self._resume, self._after = True, epoch
        self._convert: Callable[[Any], Any] | None = None
        super().__init__(
            _StreamItems(stream, self._unit),
            batch_size=None,
            sampler=_PositionSampler(self._cursor),
            worker_init_fn=self._worker_init,
            **kwargs,
        )

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # Each iter() is the next epoch, also after an unfinished one, as for streams; the first
        # iter() (or the first after load_state_dict) starts where the state says.
        cursor = self._cursor
        if not self._resume:
            cursor.epoch, cursor.position = self._after, 0
        self._resume, self._after = False, cursor.epoch + 1
        length = self.stream.epoch_length(cursor.epoch)
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
        for item in super().__iter__():
            cursor.position = min(cursor.position + self._unit, length)
            yield item if convert is None else convert(item)
        cursor.epoch, cursor.position = cursor.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """Where the next item starts; ``load_state_dict`` on a loader made the same way
        resumes there. ``offset`` is the same place as a stream's ``start_offset``; ``stream``
        is the stream's StreamState there (what the stream was made with, checked on load)."""
        cursor = self._cursor
        offset = self.stream.offset_of(cursor.epoch, cursor.position)
        return {
            "epoch": cursor.epoch,
            "position": cursor.position,
            "shuffle_seed": self.stream.shuffle_seed,
            "offset": offset,
            "stream": self.stream.state_at(offset).to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("shuffle_seed") != self.stream.shuffle_seed:
            raise ValueError(
                f"this loader's stream has shuffle_seed={self.stream.shuffle_seed}, the state "
                f"was saved with {state.get('shuffle_seed')}: make the stream with the same "
                "seed (and arguments) to resume"
            )
        if "stream" in state:  # states saved before it was added resume on the seed check
            StreamState.from_dict(state["stream"]).check_loads_into(self.stream.state())
        self._cursor.epoch = check_int("epoch", state["epoch"], 0)
        self._cursor.position = check_int("position", state["position"], 0)
        self._resume = True


def make_dataloader(stream: Stream, num_workers: int = 0, **dataloader_kwargs: Any) -> Any:
    """A DataLoader handing out ``stream``'s items as torch tensors, resumable exactly.

    A batching stream gives batches (``batch_size=`` here sets the stream's batch size when it
    has none); strings and bytes stay lists. Work runs in ``num_workers`` DataLoader workers.
    ``state_dict()`` after k consumed items, loaded into a loader made the same way, resumes at
    item k+1 with any ``num_workers``, persistent workers or not. With a predicate, each batch
    holds the passing records of one run of ``batch_size`` positions (it is not refilled).
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
    # Without a collate_fn of the user's, workers send numpy arrays (pickled through the pipe)
    # and the tensors are made here: tensors made in workers cross over by shared-memory file
    # descriptors, one socket round trip each, which costs more than the arrays themselves.
    convert = "collate_fn" not in dataloader_kwargs
    dataloader_kwargs.setdefault("collate_fn", _as_is)
    loader = ResumableDataLoader(stream, num_workers=num_workers, **dataloader_kwargs)
    loader._convert = _to_tensors if convert else None
    return loader


class _WorkerInit:
    """A DataLoader worker's start: watch the parent, then the user's ``worker_init_fn``.

    Without the watch, a worker outlived a parent that ended abruptly. Its items are numpy
    arrays pickled through the workers' one result pipe (see make_dataloader), whose read end
    every worker holds too (forked with it): once the pipe is full, a worker's queue thread
    waits to write and its siblings' wait for the queue's lock, and exiting waits for those
    threads, for ever. Torch's own check of the parent comes between items and leads to that
    exit. Tensors would cross in shared memory instead, leaving the pipe nearly empty.
    """

    def __init__(self, user: Callable[[int], Any] | None) -> None:
        self.user = user
        self.watch: ParentWatch | None = None

    def __call__(self, worker_id: int) -> None:
        if self.watch is not None:
            self.watch.start()
        if self.user is not None:
            self.user(worker_id)


def _as_is(item: Any) -> Any:
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
