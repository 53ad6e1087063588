"""A ``ray.data.Dataset``: read through its Arrow batches, or block by block in Ray tasks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from yogadl_plus.errors import SchemaError, YogaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.arrow import BATCH_ROWS, arrow_field, batch_columns, column_values
from yogadl_plus.sources.base import ColumnBatch, Description, Piece, Source
from yogadl_plus.sources.engine_table import EngineTableSource

__all__ = ["RayDatasetSource"]


class RayDatasetSource(EngineTableSource):
    """The rows of a ``ray.data.Dataset``, in its block order.

    Its Arrow schema becomes the cache's, numpy columns (Ray's tensor extension types, fixed
    or variable shaped) included; columns are taken as holding no nulls (a null names its
    field and record; pass ``schema=`` with nullable fields for columns that have some).
    A parallel build (``engine="ray"``) writes each block in its own task, on the node that
    holds it. For a stable record order, keep Ray Data's
    ``DataContext.get_current().execution_options.preserve_order = True``.
    """

    kind = "ray"

    @property
    def dataset(self) -> Any:
        """The ``ray.data.Dataset``."""
        return self.table

    def engine_schema(self) -> Schema:
        found = self.dataset.schema()
        arrow = _arrow_schema(found)
        if arrow is None:
            raise YogaError(
                f"the ray.data.Dataset has no Arrow schema ({found!r}); convert its blocks to "
                "Arrow (map_batches(..., batch_format='pyarrow')) or pass schema="
            )
        return _schema(arrow)

    def description(self) -> Description:
        """The schema when Ray knows it without running the dataset (asking a lazy dataset
        for its schema or its count can run it); not the length."""
        arrow = _arrow_schema(self.dataset.schema(fetch_if_missing=False))
        try:
            return Description() if arrow is None else Description(None, _schema(arrow))
        except SchemaError:  # a column only schema= makes cacheable
            return Description()

    def arrow_tables(self) -> Iterator[Any]:
        return self.dataset.iter_batches(batch_size=BATCH_ROWS, batch_format="pyarrow")

    def values(self, column: Any, field: Field) -> Sequence[Any]:
        return _values(column, field)

    def split(self, parts: int) -> list[Source]:
        """One piece per block of the executed dataset (``parts`` is not used: blocks are
        Ray Data's own unit of parallelism), each knowing its rows and where they start."""
        import ray

        schema = self.schema
        refs = self.dataset.to_arrow_refs()
        count = ray.remote(num_cpus=0)(_num_rows)
        sizes = ray.get([count.remote(ref) for ref in refs])
        starts = np.cumsum([0, *sizes])
        return [
            _BlockPiece(ref, schema, int(start), int(rows))
            for ref, start, rows in zip(refs, starts, sizes)
        ]


class _BlockPiece(Piece):
    """One block of a ray.data.Dataset. ``ray_object`` is its reference: the build passes it
    to the task as an argument, so that Ray runs the task where the block lives and hands it
    over as ``with_object(table)``."""

    kind = "ray"

    def __init__(self, ref: Any, schema: Schema, offset: int, rows: int, table: Any = None) -> None:
        super().__init__(schema, offset, rows)
        self.ray_object = ref
        self.table = table

    def __repr__(self) -> str:
        return f"<rows {self.start}..{self.start + self.rows} of a ray.data.Dataset>"

    def with_object(self, table: Any) -> _BlockPiece:
        return _BlockPiece(None, self._schema, self.start, self.rows, table)

    def column_batches(self) -> Iterator[ColumnBatch]:
        table = self.table
        if table is None:
            import ray

            table = ray.get(self.ray_object)
        yield batch_columns(table, self._schema, _values)


def _arrow_schema(found: Any) -> Any:
    """The Arrow schema of what ``Dataset.schema()`` gave, or None (no schema, or blocks of
    another format)."""
    arrow = getattr(found, "base_schema", found)
    return arrow if hasattr(arrow, "names") and hasattr(arrow, "field") else None


def _schema(arrow: Any) -> Schema:
    return Schema([_field(f) for f in arrow])


def _num_rows(table: Any) -> int:
    return int(table.num_rows)


def _field(column: Any) -> Field:
    """Our Field for a column (an Arrow field) of a Ray dataset: Ray's tensor extension types
    (numpy columns) by their dtype and shape, every other type as any Arrow column's, not
    nullable."""
    import pyarrow as pa

    kind = column.type
    shape = getattr(kind, "shape", None)
    storage = getattr(kind, "storage_type", None)
    if shape is None or storage is None:
        return arrow_field(column.name, kind, nullable=False)
    values = storage.field("data").type if pa.types.is_struct(storage) else storage
    dtype = np.dtype(values.value_type.to_pandas_dtype())
    ndim = getattr(kind, "ndim", None)  # set for variable-shaped tensors
    return Field(column.name, dtype, (None,) * ndim if ndim is not None else tuple(shape))


def _values(column: Any, field: Field) -> Sequence[Any]:
    if hasattr(column.type, "storage_type") and hasattr(column.type, "shape"):
        combined = column.combine_chunks() if hasattr(column, "combine_chunks") else column
        return combined.to_numpy(zero_copy_only=False)  # (n, *shape), or arrays of any shape
    return column_values(column, field)
