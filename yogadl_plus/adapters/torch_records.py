"""The two parts of a plain PyTorch DataLoader over one DataRef: ``RecordDataset``, map-style
(``ds[i]`` is record ``i``), and ``StreamSampler``, the record indices in a stream's order."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset, Sampler

from yogadl_plus.adapters.keras_build import (
    a_thread_builds_the_model,
    makes_an_iterator_to_drop,
    until_an_empty_epoch,
)
from yogadl_plus.adapters.torch_ddp import refuse_uneven_shards
from yogadl_plus.checks import check_int
from yogadl_plus.columns import records
from yogadl_plus.mixture import Mixture
from yogadl_plus.order import OrderSettings, shard_order
from yogadl_plus.stream.keywords import order_settings

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef

__all__ = ["RecordDataset", "StreamSampler"]

# Indices an epoch's order computes at a time.
_INDICES_AT_ONCE = 4096


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

    The order is the stream's keywords of that name, or ``order=`` (an ``OrderSettings``) in
    their place. Each ``iter()`` is the next epoch; ``set_epoch(e)`` picks the epoch of the
    next ``iter()`` (as DistributedSampler does). ``start_offset`` counts this shard's
    positions from epoch 0, as for streams; ``shuffle_window`` is the stream's windowed
    shuffle. An iteration Keras makes only to drop it (``model.fit`` of a DataLoader with this
    sampler reads a batch to build the model, and with workers makes each next epoch's
    iterator twice) hands out what the next one will, and the epoch stays.
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
        order: OrderSettings | None = None,
    ) -> None:
        settings = order_settings(
            "StreamSampler", order,
            shuffle=shuffle, shuffle_seed=shuffle_seed, shard_rank=shard_rank,
            num_shards=num_shards, drop_shard_remainder=drop_shard_remainder,
            pad_shard_remainder=pad_shard_remainder,
            start_offset=start_offset, skip_shuffle_at_epoch_end=skip_shuffle_at_epoch_end,
            shuffle_window=shuffle_window,
        ).seeded()  # fmt: skip
        _refuse_mixture("StreamSampler", dataref)
        self.order = shard_order(settings, len(dataref), dataref.chunk_records)
        refuse_uneven_shards(
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
        for start in range(position, length, _INDICES_AT_ONCE):
            stop = min(start + _INDICES_AT_ONCE, length)
            yield from self.order.indices(epoch, start, stop).tolist()


def _refuse_mixture(what: str, dataref: Any) -> None:
    if isinstance(dataref, Mixture):
        raise TypeError(
            f"{what} indexes one DataRef's records; which record a Mixture's position reads "
            "changes with the epoch: use make_dataloader(mix.stream(...)) for a mixture"
        )
