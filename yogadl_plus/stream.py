"""Stream: which record comes next, as index arithmetic, then reading it through a DataRef.

The order is ``EpochOrder``: a pure function of (epoch, position). The stream only keeps where
it is (``offset``), so resuming anywhere costs the same as starting at 0.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from yogadl_plus.checks import check_int
from yogadl_plus.order import EpochOrder

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef

__all__ = ["Stream"]

# Positions whose order is computed at once: few first, so the first item comes fast.
_FIRST_BLOCK = 32
_ORDER_BLOCK = 4096
# Records decoded at once when iterating record by record (bounds memory for large records).
_READ_BLOCK = 512


class Stream:
    """One shard's view of a dataset, epoch after epoch (see ``DataRef.stream``).

    Each ``iter()`` is one epoch, the next one each time, even when the last was left
    unfinished. ``offset`` is the ``start_offset`` that resumes right after the last item
    handed out.
    """

    def __init__(
        self,
        dataref: DataRef,
        *,
        start_offset: int = 0,
        shuffle: bool = False,
        shuffle_seed: int | None = None,
        skip_shuffle_at_epoch_end: bool = False,
        shard_rank: int = 0,
        num_shards: int = 1,
        drop_shard_remainder: bool = False,
        fields: Sequence[str] | str | None = None,
        predicate: Any = None,
        ngram: Any = None,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        batch_size: int | None = None,
        drop_last: bool = False,
        num_workers: int = 0,
        prefetch: int | None = None,
    ) -> None:
        self.dataref = dataref
        start = check_int("start_offset", start_offset, 0)
        if predicate is not None or ngram is not None or num_workers:
            raise NotImplementedError(
                "predicate=, ngram= and num_workers > 0 are not in this release of yogadl_plus"
            )
        check_int("num_workers", num_workers, 0)
        if batch_size is not None:
            check_int("batch_size", batch_size, 1)
        if shuffle and shuffle_seed is None:
            if num_shards != 1:
                raise ValueError(
                    "shuffle=True with num_shards > 1 needs an explicit shuffle_seed, shared by "
                    "all ranks; otherwise each rank would draw its own and the shards would overlap"
                )
            shuffle_seed = secrets.randbits(63)
        if shuffle_seed is not None:
            check_int("shuffle_seed", shuffle_seed, 0)
        self.order = EpochOrder(
            len(dataref),
            shuffle=shuffle,
            seed=shuffle_seed,
            skip_shuffle_at_epoch_end=skip_shuffle_at_epoch_end,
            shard_rank=shard_rank,
            num_shards=num_shards,
            drop_shard_remainder=drop_shard_remainder,
        )
        self.shuffle = shuffle
        self.shuffle_seed = shuffle_seed
        self.fields = dataref.select(fields)
        self.transform = transform
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.positions_per_epoch = self.order.shard_length
        self._offset = start
        self._next_start = start

    def __repr__(self) -> str:
        return (
            f"Stream({self.dataref!r}, order={self.order!r}, offset={self._offset}, "
            f"batch_size={self.batch_size})"
        )

    @property
    def offset(self) -> int:
        """The start_offset that resumes right after the last item handed out."""
        return self._offset

    def __len__(self) -> int:
        """Items (records or batches) in one epoch of this shard."""
        positions = self.positions_per_epoch
        if self.batch_size is None:
            return positions
        if self.drop_last:
            return positions // self.batch_size
        return -(-positions // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        per_epoch = self.positions_per_epoch
        if per_epoch == 0:
            return iter(())
        epoch, position = divmod(self._next_start, per_epoch)
        self._next_start = (epoch + 1) * per_epoch
        if self.batch_size is None:
            return self._records(epoch, position)
        return self._batches(epoch, position)

    def _order_blocks(
        self, epoch: int, position: int, first: int, size: int
    ) -> Iterator[tuple[int, np.ndarray]]:
        """(position, record indices) for runs of this epoch's order, from ``position`` on.

        The order is computed for many positions at once (it costs per call, not per
        position); the first run is short so that the first item comes quickly.
        """
        per_epoch = self.positions_per_epoch
        block = first
        while position < per_epoch:
            stop = min(position + block, per_epoch)
            yield position, self.order.indices(epoch, position, stop)
            position = stop
            block = size

    def _records(self, epoch: int, position: int) -> Iterator[dict[str, Any]]:
        per_epoch = self.positions_per_epoch
        base = epoch * per_epoch
        names = [f.name for f in self.fields]
        transform = self.transform
        for start, indices in self._order_blocks(epoch, position, _FIRST_BLOCK, _ORDER_BLOCK):
            offset = base + start
            # Read (and hold in memory) a bounded number of records at a time.
            for read in range(0, len(indices), _READ_BLOCK):
                columns = self.dataref.read_rows(indices[read : read + _READ_BLOCK], self.fields)
                for row in zip(*columns):
                    offset += 1
                    record = dict(zip(names, row))
                    self._offset = offset
                    yield record if transform is None else transform(record)
        self._offset = base + per_epoch

    def _batches(self, epoch: int, position: int) -> Iterator[dict[str, Any]]:
        per_epoch = self.positions_per_epoch
        size = self.batch_size
        assert size is not None
        base = epoch * per_epoch
        per_block = size * max(1, _ORDER_BLOCK // size)
        for start, indices in self._order_blocks(epoch, position, size, per_block):
            for first in range(0, len(indices), size):
                batch_indices = indices[first : first + size]
                if self.drop_last and len(batch_indices) < size:
                    break
                if self.transform is None:
                    batch = self.dataref.read_columns(batch_indices, self.fields)
                else:
                    batch = _collate([self.transform(r) for r in self._rows(batch_indices)])
                self._offset = base + start + first + len(batch_indices)
                yield batch
        self._offset = base + per_epoch

    def _rows(self, indices: np.ndarray) -> Iterator[dict[str, Any]]:
        names = [f.name for f in self.fields]
        for row in zip(*self.dataref.read_rows(indices, self.fields)):
            yield dict(zip(names, row))


def _collate(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack transformed records: equal-shape arrays and numbers into arrays, the rest in lists."""
    out: dict[str, Any] = {}
    for name in records[0]:
        values = [r[name] for r in records]
        first = values[0]
        if isinstance(first, (np.ndarray, np.generic, int, float, bool)) and not isinstance(
            first, (str, bytes)
        ):
            shapes = {np.shape(v) for v in values}
            if len(shapes) == 1:
                out[name] = np.stack([np.asarray(v) for v in values])
                continue
        out[name] = values
    return out
