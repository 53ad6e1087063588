"""RecordSource: what a Stream reads, a DataRef or a Mixture of them, through one protocol.

A source has a length (positions of an unshuffled epoch), a schema, an identity (what a saved
stream state names it by), the DataRefs it reads (``leaves``) and the arithmetic of where a run
of positions reads (``place``). A Stream, and everything above it, asks only these: it has one
code path for every kind of source and never asks which kind it has.

``stream(...)`` is here, once, for every source: its keywords are the whole set of stream
options, each a field of one of the settings dataclasses the stream layer is made of
(``OrderSettings``, ``BoundarySettings``, ``WorkerSettings``), which check them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from yogadl_plus.order.settings import OrderSettings

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef
    from yogadl_plus.order.placement import Placement
    from yogadl_plus.schema import Field, Schema
    from yogadl_plus.stream import Stream

__all__ = ["Leaf", "RecordSource"]


class Leaf:
    """A DataRef a source reads, and the names that lead to it: ``()`` for a DataRef itself,
    ``("web",)`` in a mixture, ``("text", "books")`` inside a mixture of mixtures. ``used``:
    its share of an epoch is not zero (a mixture's source of weight 0 is never read, and its
    fields need not match)."""

    __slots__ = ("path", "ref", "used")

    def __init__(self, path: tuple[str, ...], ref: DataRef, used: bool = True) -> None:
        self.path = path
        self.ref = ref
        self.used = used

    @property
    def name(self) -> str:
        """The path joined by '/' ('' for a DataRef's own leaf)."""
        return "/".join(self.path)

    def __repr__(self) -> str:
        return f"Leaf({self.name!r}, {self.ref!r})"


class RecordSource(ABC):
    """What a Stream reads: positions of an epoch, each reading one record of one DataRef."""

    #: Positions worth placing in one call: the order and ``place`` cost per call, so a stream
    #: computes them for this many positions at once.
    place_block = 4096

    @property
    @abstractmethod
    def schema(self) -> Schema:
        """The fields every item has alike."""

    @abstractmethod
    def __len__(self) -> int:
        """Positions in one epoch, unsharded."""

    @abstractmethod
    def __getitem__(self, index: int) -> dict[str, Any]:
        """Position ``index`` of the unshuffled epoch 0, as a dict of decoded fields."""

    @abstractmethod
    def get_batch(
        self, indices: Sequence[int] | np.ndarray, fields: Sequence[str] | str | None = None
    ) -> dict[str, Any]:
        """The items at positions ``indices`` of the unshuffled epoch 0, as field -> stacked
        array (a list for variable shapes, strings and bytes)."""

    @property
    @abstractmethod
    def leaves(self) -> tuple[Leaf, ...]:
        """The DataRefs this source reads, in the order ``place`` numbers them."""

    @abstractmethod
    def identity(self) -> tuple[str, str]:
        """What a stream's state names this source by: a name for people and a digest of
        everything that fixes which record a position reads (builds, shares)."""

    @abstractmethod
    def place(self, epoch: int, positions: np.ndarray, shuffle: bool, seed: int) -> Placement:
        """Where ``positions`` (of the epoch's order, in a run) read in epoch ``epoch``."""

    @property
    @abstractmethod
    def chunk_records(self) -> np.ndarray:
        """Positions per chunk of storage, in order: what a windowed shuffle or a shard of
        whole chunks groups (a source without chunks of its own has one)."""

    @property
    @abstractmethod
    def record_bytes(self) -> float:
        """The bytes a record takes in the chunk files, on average (at least 1)."""

    @property
    @abstractmethod
    def chunk_bytes(self) -> float:
        """The bytes of a chunk file, on average (of the smallest-chunked leaf)."""

    @abstractmethod
    def stream_fields(
        self, fields: Sequence[str] | str | None, batching: bool
    ) -> tuple[Field, ...]:
        """The fields a stream's items hold, for ``fields=`` (SchemaError for one that the
        items cannot hold alike: in batches every item has them)."""

    @abstractmethod
    def check_stream(self, order: OrderSettings, windows: bool) -> None:
        """ValueError for what a stream over this source cannot do (``windows``: n-grams)."""

    def schedule_of_state(self) -> dict[str, list[list[Any]]] | None:
        """What a stream's state keeps of a schedule of shares (a Mixture's): None, none."""
        return None

    def schedule_difference(self, saved: Mapping[str, Any] | None, epoch: int) -> str | None:
        """Where ``saved`` (a state's schedule) deals epochs up to ``epoch`` otherwise than
        this source, as a message (None: nowhere). A source without a schedule has nothing to
        compare: its identity names it whole."""
        return None

    @property
    def source_kinds(self) -> tuple[str, ...]:
        """What each leaf was cached from ("tensorflow", "torch", "parquet", ...)."""
        return tuple(leaf.ref.source_kind for leaf in self.leaves)

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
