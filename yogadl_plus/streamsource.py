"""What the stream layer reads, declared below it: a source's positions (``StreamSource``), and
the records of each DataRef it reads (``LeafSource``, one ``Leaf`` each).

``RecordSource`` (recordsource.py) is a ``StreamSource`` that makes streams; a DataRef is both
a RecordSource and a LeafSource. The stream layer knows only these declarations, never the
classes that implement them, so neither imports the other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from yogadl_plus.cache.fixed import Allocate, FieldSpans, Values
    from yogadl_plus.cache.layout import RecordLayout
    from yogadl_plus.order.placement import Placement
    from yogadl_plus.order.settings import OrderSettings
    from yogadl_plus.schema import Field, Schema

__all__ = ["Leaf", "LeafSource", "StreamSource"]


class LeafSource(Protocol):
    """What a stream reads of one leaf's records (a DataRef): its reader, n-gram windows and
    skip lists ask only this."""

    @property
    def schema(self) -> Schema:
        """The leaf's fields."""
        ...

    def __len__(self) -> int: ...

    def select(self, fields: Sequence[str] | str | None) -> tuple[Field, ...]:
        """The Fields named by ``fields`` (None: all); KeyError naming an unknown one."""
        ...

    def read_values(self, indices: np.ndarray) -> Values:
        """The raw record values at checked indices, to decode with ``layout``."""
        ...

    def field_spans(self, fields: Sequence[Field]) -> FieldSpans | None:
        """How ``read_spans`` reads ``fields``, or None where it cannot."""
        ...

    def read_spans(self, indices: np.ndarray, spans: FieldSpans) -> dict[str, np.ndarray] | None:
        """The fields ``spans`` describes (``field_spans``) of the records at checked
        ``indices``, each gathered straight into its array; None where they cannot be."""
        ...

    def has_columns(self, fields: Sequence[Field]) -> bool:
        """Whether every one of ``fields`` is kept as a whole-chunk column."""
        ...

    def read_columns(
        self, indices: np.ndarray, fields: Sequence[Field], allocate: Allocate | None = None
    ) -> dict[str, Any]:
        """The ``fields`` of the records at checked ``indices``, decoded, as columns."""
        ...

    @property
    def layout(self) -> RecordLayout:
        """How the record values are laid out: decodes what ``read_values`` gives."""
        ...

    def read_ahead(self, indices: np.ndarray, now: bool = False) -> None:
        """The records at ``indices`` will be read soon (``now``: at once); a hint."""
        ...

    # (What sources made of leaves, and the faces, ask of them besides.)

    def __getitem__(self, index: int) -> dict[str, Any]: ...

    def get_batch(
        self,
        indices: Sequence[int] | np.ndarray,
        fields: Sequence[str] | str | None = None,
        decode: bool = True,
    ) -> dict[str, Any]: ...

    def read_record(self, index: int, fields: Sequence[Field]) -> dict[str, Any]: ...

    @property
    def record_bytes(self) -> float: ...

    @property
    def chunk_bytes(self) -> float: ...

    @property
    def source_kind(self) -> str:
        """What the leaf was cached from ("tensorflow", "torch", "parquet", ...)."""
        ...

    def close(self) -> None: ...


class Leaf:
    """A DataRef a source reads, and the names that lead to it: ``()`` for a DataRef itself,
    ``("web",)`` in a mixture, ``("text", "books")`` inside a mixture of mixtures. ``used``:
    its share of an epoch is not zero (a mixture's source of weight 0 is never read, and its
    fields need not match)."""

    __slots__ = ("path", "ref", "used")

    def __init__(self, path: tuple[str, ...], ref: LeafSource, used: bool = True) -> None:
        self.path = path
        self.ref = ref
        self.used = used

    @property
    def name(self) -> str:
        """The path joined by '/' ('' for a DataRef's own leaf)."""
        return "/".join(self.path)

    def __repr__(self) -> str:
        return f"Leaf({self.name!r}, {self.ref!r})"


class StreamSource(ABC):
    """What a Stream reads: positions of an epoch, each reading one record of one leaf (a
    DataRef). ``RecordSource`` (recordsource.py) is one with ``stream(...)``."""

    #: Positions worth placing in one call: the order and ``place`` cost per call, so a stream
    #: computes them for this many positions at once. (A shuffle's network costs least per
    #: position at about 8192: fewer calls, and its arrays still in the CPU's cache.)
    place_block = 8192

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
        self,
        indices: Sequence[int] | np.ndarray,
        fields: Sequence[str] | str | None = None,
        decode: bool = True,
    ) -> dict[str, Any]:
        """The items at positions ``indices`` of the unshuffled epoch 0, as field -> stacked
        array (a list for variable shapes, strings and bytes); ``decode=False``: image fields
        as their stored bytes."""

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

    @property
    def source_kinds(self) -> tuple[str, ...]:
        """What each leaf was cached from ("tensorflow", "torch", "parquet", ...)."""
        return tuple(leaf.ref.source_kind for leaf in self.leaves)

    def schedule_of_state(self) -> dict[str, list[list[Any]]] | None:
        """What a stream's state keeps of a schedule of shares (a Mixture's): None, none."""
        return None

    def schedule_difference(self, saved: Mapping[str, Any] | None, epoch: int) -> str | None:
        """Where ``saved`` (a state's schedule) deals epochs up to ``epoch`` otherwise than
        this source, as a message (None: nowhere). A source without a schedule has nothing to
        compare: its identity names it whole."""
        return None
