"""A source is anything yogadl_plus can read records from once, to cache them."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from yogadl_plus.errors import SchemaError
from yogadl_plus.schema import Schema

__all__ = [
    "ColumnBatch",
    "Description",
    "Piece",
    "Source",
    "even_cuts",
    "even_ranges",
    "flatten_into",
]

#: Some rows of a source as columns: (field name -> the rows' values: an array of shape
#: ``(rows, *field.shape)`` or a sequence of one value per row, None for a null), and the rows.
ColumnBatch = tuple[dict[str, Any], int]


@dataclass(frozen=True)
class Description:
    """What a source tells of its data without reading a record: how many records it holds
    and their schema, each None where only reading would tell."""

    length: int | None = None
    schema: Schema | None = None


class Source:
    """Records plus what is known about them before reading: schema, size, fingerprint."""

    #: A short name stored in the manifest ("iterable", "parquet", ...).
    kind: str = ""
    #: For a part of a split source: the index of its first record in the whole source.
    offset: int | None = None
    #: The framework module that reading a piece of this source imports in a worker process
    #: ("torch"); "" for none beyond what the build imports itself.
    framework: str = ""
    #: Whether the framework's own loaders fork their workers from the user's process (a
    #: torch DataLoader's, on Linux): a parallel build may then fork its workers too, where
    #: that is safe, instead of importing the framework again in each.
    forked_by_its_framework: bool = False

    def records(self) -> Iterator[Mapping[str, Any]]:
        """The records, in storage order; called once per build. A source that holds columns
        gives ``column_batches()`` and gets these from it: their rows as records."""
        batches = self.column_batches()
        if batches is None:
            raise NotImplementedError(f"{type(self).__name__} gives no records()")
        for columns, _ in batches:
            names = list(columns)
            for row in zip(*columns.values()):
                yield dict(zip(names, row))

    @property
    def schema(self) -> Schema | None:
        """The schema when the source knows it without reading records (Arrow, tf element_spec)."""
        return None

    @property
    def length(self) -> int | None:
        """The number of records when known cheaply, for the progress bar."""
        return None

    def description(self) -> Description:
        """What the source tells of its data without reading a record or a file, for a version
        cached from it to be compared with (``length`` and ``schema`` by default). A source
        whose length is only a hint, or whose schema costs reading files, says less."""
        try:
            schema = self.schema
        except SchemaError:  # it cannot tell one without schema=: nothing to compare
            schema = None
        return Description(self.length, schema)

    def fingerprint(self) -> str | None:
        """A cheap identity of the data (file paths, sizes, mtimes), or None when there is none."""
        return None

    def column_batches(self) -> Iterator[ColumnBatch] | None:
        """The records as batches of columns, in storage order, when the source holds them so
        (then a build encodes a batch per call, without a dict per record); None: read
        ``records()``. Called once per build, instead of ``records()``."""
        return None

    def split(self, parts: int) -> list[Source] | None:
        """At most ``parts`` pieces for a parallel build: picklable, readable in another
        process, and in order (their records, one piece after the other, are this source's
        records). None when the source can only be read once, in order (a generator)."""
        return None


class Piece(Source):
    """A part of a split source: its records start at ``start`` in the whole source, there are
    ``rows`` of them, and they follow the whole source's schema."""

    def __init__(self, schema: Schema, start: int, rows: int) -> None:
        self._schema = schema
        self.offset = self.start = start
        self.rows = rows

    @property
    def schema(self) -> Schema:
        return self._schema

    @property
    def length(self) -> int:
        return self.rows


def flatten_into(
    out: dict[str, Any], prefix: str, item: Mapping[Any, Any], value: Callable[[Any, str], Any]
) -> None:
    """Put ``item``'s values in ``out`` under their field names: keys, nested dicts' joined
    with "/" (under ``prefix``), each value made a record value by ``value(value, name)``."""
    for key, element in item.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(element, Mapping):
            flatten_into(out, name, element, value)
        else:
            out[name] = value(element, name)


def even_cuts(sizes: Sequence[int], parts: int) -> list[range]:
    """Split units of the given sizes into at most ``parts`` consecutive, non-empty runs of
    nearly equal total size (ranges of unit indices, covering every unit in order)."""
    if not sizes:
        return []
    ends = np.cumsum(sizes, dtype=np.float64)
    targets = ends[-1] * np.arange(1, parts) / parts
    cuts = np.unique(np.searchsorted(ends, targets, side="left") + 1)
    bounds = [0, *(int(c) for c in cuts if 0 < c < len(sizes)), len(sizes)]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def even_ranges(total: int, parts: int) -> list[range]:
    """``range(total)`` cut into at most ``parts`` consecutive, non-empty ranges of nearly
    equal length."""
    bounds = sorted({total * k // parts for k in range(parts + 1)})
    return [range(a, b) for a, b in itertools.pairwise(bounds)]
