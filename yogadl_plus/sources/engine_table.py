"""A table a data engine holds (a ``ray.data.Dataset``, a Spark DataFrame), read as Arrow tables:
what the Ray and Spark sources share. What only one engine knows (Ray's blocks and tensor types,
Spark's SQL types and partitions) stays in its own module."""

from __future__ import annotations

import functools
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.arrow import batch_columns, column_values
from yogadl_plus.sources.base import ColumnBatch, Source

__all__ = ["EngineTableSource"]


class EngineTableSource(Source):
    """The rows of ``table``, an engine's table, in its own order: its schema is worked out
    once, from the engine's (``engine_schema``), and its records are read from the Arrow
    tables the engine hands out (``arrow_tables``), each column made record values by
    ``values``."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table!r})"

    @functools.cached_property
    def schema(self) -> Schema:  # asked by the build, records() and split(): worked out once
        return self.engine_schema()

    def column_batches(self) -> Iterator[ColumnBatch]:
        schema = self.schema
        for table in self.arrow_tables():
            yield batch_columns(table, schema, self.values)

    @abstractmethod
    def engine_schema(self) -> Schema:
        """The cache's schema, from the engine's schema of the table."""

    @abstractmethod
    def arrow_tables(self) -> Iterator[Any]:
        """The table's rows as Arrow tables (or record batches), in order."""

    def values(self, column: Any, field: Field) -> Sequence[Any]:
        """The record values of ``field`` in an Arrow ``column``."""
        return column_values(column, field)
