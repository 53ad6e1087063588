"""RecordSource: what a Stream reads, a DataRef or a Mixture of them, through one protocol.

A source has a length (positions of an unshuffled epoch), a schema, an identity (what a saved
stream state names it by), the DataRefs it reads (``leaves``) and the arithmetic of where a run
of positions reads (``place``). A Stream, and everything above it, asks only these: it has one
code path for every kind of source and never asks which kind it has. Those members are declared
below the stream layer, in streamsource.py (``StreamSource``, and ``LeafSource`` for what is read
of each DataRef); ``Leaf`` is there too.

``stream(...)`` is here, once, for every source: its keywords are the whole set of stream
options, each a field of one of the settings dataclasses the stream layer is made of
(``OrderSettings``, ``BoundarySettings``, ``WorkerSettings``), which check them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from yogadl_plus.streamsource import Leaf, LeafSource, StreamSource

if TYPE_CHECKING:
    from yogadl_plus.stream import Stream

__all__ = ["Leaf", "LeafSource", "RecordSource"]


class RecordSource(StreamSource):
    """What a Stream reads (a ``StreamSource``: positions of an epoch, each reading one record
    of one DataRef), and the streams over it: ``stream(...)``."""

    def stream(
        self,
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
        pad_shard_remainder: bool = False,
        shard_by: str = "records",
        fields: Sequence[str] | str | None = None,
        predicate: Any = None,
        skip: Any = None,
        ngram: Any = None,
        transform: Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        drop_last: bool = False,
        num_workers: int = 0,
        prefetch: int | None = None,
        worker_type: str = "thread",
        worker_start_method: str | None = None,
    ) -> Stream:
        """A Stream over this source: one shard of its epochs, one after the other.

        Order: ``shuffle``, ``shuffle_seed`` (drawn when None; required with shards),
        ``skip_shuffle_at_epoch_end``, ``shuffle_window`` (shuffle within windows of that many
        chunks; docs/windowed-shuffle.md), ``shard_rank``/``num_shards``/``drop_shard_remainder``
        /``pad_shard_remainder``/``shard_by``, ``start_offset`` (positions of this shard from
        epoch 0), ``global_start`` (elastic resume). Boundary: ``fields``, ``predicate``
        (ydl.predicates), ``skip`` (record indices never handed out; for a mixture, source name
        -> indices), ``ngram`` (ydl.NGram), ``transform``, ``batch_size``/``drop_last``.
        Workers: ``num_workers``, ``worker_type`` ("thread", "process", or "ray": actors on the
        cluster ``ray.init()`` joined), ``prefetch`` (units in flight), ``worker_start_method``.
        See docs/streams.md, docs/boundary.md and docs/many-machines.md.
        """
        from yogadl_plus.stream import Stream
        from yogadl_plus.stream.keywords import routed

        settings = routed(
            dict(
                start_offset=start_offset, global_start=global_start, shuffle=shuffle,
                shuffle_seed=shuffle_seed, skip_shuffle_at_epoch_end=skip_shuffle_at_epoch_end,
                shuffle_window=shuffle_window, shard_rank=shard_rank, num_shards=num_shards,
                drop_shard_remainder=drop_shard_remainder,
                pad_shard_remainder=pad_shard_remainder, shard_by=shard_by,
                fields=fields, predicate=predicate, skip=skip, ngram=ngram, transform=transform,
                batch_size=batch_size, drop_last=drop_last,
                num_workers=num_workers, prefetch=prefetch, worker_type=worker_type,
                worker_start_method=worker_start_method,
            )
        )  # fmt: skip
        return Stream(self, *settings)
