"""Grain faces over DataRef and Mixture: ``ydl.grain``.

A DataRef and a Mixture already are Grain random-access sources as they are (``len``,
``ref[i]``, picklable into Grain's worker processes); this module adds what Grain cannot get
from them alone:

- ``source(ref_or_mix, fields=None)``: a ``GrainSource`` that reads only the ``fields`` asked
  for, reads many records in one vectorized step where Grain asks for a batch of them
  (``_getitems``), and whose ``repr`` names the build it reads, so a Grain checkpoint taken
  over one build of a version is refused over another.
- ``sampler(ref, shuffle=..., shuffle_seed=..., shard_options=...)``: a ``StreamSampler``, the
  Grain sampler that hands ``grain.DataLoader`` the record order of ``ref.stream(...)``: our
  keyed permutation, reshuffled across shards every epoch. A sampler is a pure function of the
  index (as Grain's own), so ``DataLoader`` checkpoints resume exactly.

See docs/adapters/grain.md, which also says how Grain's own shuffle differs from ours.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from yogadl_plus import recordsource
from yogadl_plus.checks import check_bool, check_index, check_int
from yogadl_plus.columns import records
from yogadl_plus.dataref import DataRef
from yogadl_plus.mixture import Mixture
from yogadl_plus.order import OrderSettings, shard_order
from yogadl_plus.schema import Field
from yogadl_plus.stream.keywords import order_settings

__all__ = ["GrainSource", "StreamSampler", "sampler", "source"]


def source(
    data: recordsource.RecordSource, fields: Sequence[str] | str | None = None
) -> GrainSource:
    """A Grain random-access source over ``data`` (a DataRef: record ``i``; a Mixture:
    position ``i`` of its unshuffled epoch 0) that decodes only ``fields`` (None: all; for a
    Mixture, those every source has alike). For ``grain.MapDataset.source(...)`` and
    ``grain.DataLoader(data_source=...)``."""
    return GrainSource(data, fields)


class GrainSource:
    """A DataRef or Mixture as a Grain ``RandomAccessDataSource`` (see ``source``).

    ``src[i]`` is a dict of the selected fields; ``src._getitems(indices)`` (Grain's batched
    read protocol) reads them together. Picklable into Grain's worker processes: each copy
    opens its own handles there.
    """

    def __init__(
        self, data: recordsource.RecordSource, fields: Sequence[str] | str | None = None
    ) -> None:
        if not isinstance(data, recordsource.RecordSource):
            raise TypeError(
                f"ydl.grain.source reads a DataRef or a Mixture, got {type(data).__name__}"
            )
        # Every item of a batch needs the same fields: for a mixture, those each source has alike.
        chosen = data.stream_fields(fields, batching=True)
        names = [f.name for f in chosen]
        self._leaf_fields = [leaf.ref.select(names) if leaf.used else () for leaf in data.leaves]
        dataset, build = data.identity()
        self.data = data
        self.fields: tuple[Field, ...] = tuple(chosen)
        self._names = names
        self._described = f"{dataset}@{build[:16]}"

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Record ``index`` of a DataRef; position ``index`` of a mixture's unshuffled epoch 0."""
        i = check_index(index, len(self.data), "GrainSource", "index")
        ((leaf, _, found),) = self.data.place(0, np.array([i]), False, 0).parts
        return self.data.leaves[leaf].ref.read_record(int(found[0]), self._leaf_fields[leaf])

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The items at ``indices``, read and decoded in one step (Grain's
        ``SupportsBatchedReadRandomAccessDataSource``)."""
        return records(self.data.get_batch(indices, self._names), len(indices))

    def __repr__(self) -> str:
        # Grain checks a DataLoader checkpoint against repr(data_source): naming the build
        # makes a checkpoint over another build of the version (an overwrite) a clear refusal.
        return f"ydl.grain.source({self._described}, fields={self._names})"


class StreamSampler:
    """A Grain sampler with ``dataref.stream(...)``'s record order, for ``grain.DataLoader``
    (``ydl.grain.sampler``): ``sampler[k]`` is the ``grain.RecordMetadata`` of global index
    ``k``, record ``order(k // epoch_length, k % epoch_length)``. A pure function of ``k``:
    Grain's DataLoader checkpoints resume exactly.

    ``shard_options`` is Grain's (``grain.sharding.ShardOptions``; None: no sharding), given
    to the DataLoader too (or only here: the DataLoader takes it from its sampler). Shard ``r``
    of ``S`` reads global positions ``r, r + S, ...`` of each epoch's order, as
    ``dataref.stream(num_shards=S, shard_rank=r)`` does; with ``drop_remainder=True`` each epoch
    is first cut to a multiple of ``S`` (``drop_shard_remainder=True``) and every shard's order is
    exactly that stream's. ``num_epochs=None`` repeats forever. The shuffle's keywords may
    come as one ``OrderSettings`` instead (``order=``), without shards or a start.
    """

    def __init__(
        self,
        dataref: DataRef,
        *,
        shuffle: bool = False,
        shuffle_seed: int | None = None,
        shard_options: Any = None,
        num_epochs: int | None = None,
        skip_shuffle_at_epoch_end: bool = False,
        shuffle_window: int | None = None,
        order: OrderSettings | None = None,
    ) -> None:
        if isinstance(dataref, Mixture):
            raise TypeError(
                "ydl.grain.sampler orders one DataRef's records; which record a Mixture's "
                "position reads changes with the epoch, and Grain reads a source by one key: "
                "use grain.samplers.IndexSampler over ydl.grain.source(mix), or mix.stream(...)"
            )
        check_bool("shuffle", shuffle)
        settings = order_settings(
            "ydl.grain.sampler", order,
            shuffle=shuffle, shuffle_seed=shuffle_seed,
            skip_shuffle_at_epoch_end=skip_shuffle_at_epoch_end, shuffle_window=shuffle_window,
        )  # fmt: skip
        _check_grain_order(settings)
        self.order = shard_order(settings, len(dataref), dataref.chunk_records)
        self.shuffle_seed = settings.shuffle_seed
        if shard_options is None:
            shard_options = grain.sharding.NoSharding()
        # Grain's name: a DataLoader given no shard_options takes its sampler's.
        self._shard_options = shard_options
        n, shards = len(dataref), shard_options.shard_count
        self.epoch_length = n - n % shards if shard_options.drop_remainder else n
        if not self.epoch_length:
            raise ValueError(
                f"{dataref!r} has no records to sample"
                + (f" in whole rounds of {shards} shards" if n else "")
            )
        self.num_epochs = None if num_epochs is None else check_int("num_epochs", num_epochs, 1)
        self._length = sys.maxsize if num_epochs is None else num_epochs * self.epoch_length
        dataset, build = dataref.identity()
        self._described = f"{dataset}@{build[:16]}"

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> grain.RecordMetadata:
        if not 0 <= index < self._length:
            raise IndexError(
                f"Got index {index}, allowed indices should be in [0, {self._length - 1}]"
            )
        epoch, position = divmod(index, self.epoch_length)
        rng = None
        if self.shuffle_seed is not None:  # as Grain's IndexSampler, for random transforms
            rng = np.random.Generator(np.random.Philox(key=self.shuffle_seed + index))
        return grain.RecordMetadata(
            index=index, record_key=self.order.index(epoch, position), rng=rng
        )

    def __repr__(self) -> str:
        order = self.order.settings
        window = "" if order.shuffle_window is None else f", shuffle_window={order.shuffle_window}"
        return (
            f"ydl.grain.StreamSampler({self._described}, shuffle={order.shuffle}, "
            f"shuffle_seed={self.shuffle_seed}, "
            f"skip_shuffle_at_epoch_end={order.skip_shuffle_at_epoch_end}{window}, "
            f"shard_options={self._shard_options!r}, num_epochs={self.num_epochs})"
        )


sampler = StreamSampler  # ydl.grain.sampler(ref, shuffle=..., ...): the name users call


def _check_grain_order(order: OrderSettings) -> None:
    """ValueError for an order a Grain sampler cannot keep: one drawn at random, or shards and
    a start (Grain's ``shard_options`` and its checkpoints hold those)."""
    if order.shuffle and order.shuffle_seed is None:
        raise ValueError(
            "shuffle=True needs a shuffle_seed: Grain checks a DataLoader checkpoint "
            "against repr(sampler), so a seed drawn at random would make it unloadable"
        )
    if order != OrderSettings(
        shuffle=order.shuffle, shuffle_seed=order.shuffle_seed,
        skip_shuffle_at_epoch_end=order.skip_shuffle_at_epoch_end,
        shuffle_window=order.shuffle_window,
    ):  # fmt: skip
        raise ValueError(
            f"ydl.grain.sampler: order={order!r} shards or starts part-way; Grain shards with "
            "shard_options= and resumes from its own checkpoints: give the sampler only the "
            "shuffle (shuffle, shuffle_seed, skip_shuffle_at_epoch_end, shuffle_window)"
        )
