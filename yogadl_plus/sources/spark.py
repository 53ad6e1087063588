"""A Spark DataFrame: its partitions are written as chunks by the Spark executors themselves
(see the build's Spark runner, build_on_spark); here, what the build knows of it and how a task
reads its part.

Nothing here imports pyspark: the DataFrame and its types are used through their own methods,
so this module loads on the driver and in executors alike, with or without the extra.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from yogadl_plus.errors import SchemaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.arrow import batch_columns
from yogadl_plus.sources.base import ColumnBatch, Source
from yogadl_plus.sources.engine_table import EngineTableSource

__all__ = ["SparkDataFrameSource", "SparkPartition", "spark_field"]

# Spark SQL type names (DataType.typeName()) -> what a value of that type becomes.
_KINDS: dict[str, Any] = {
    "boolean": np.dtype(bool),
    "byte": np.dtype(np.int8),
    "short": np.dtype(np.int16),
    "integer": np.dtype(np.int32),
    "long": np.dtype(np.int64),
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "date": np.dtype("datetime64[D]"),
    "timestamp": np.dtype("datetime64[us]"),  # an instant, in UTC
    "timestamp_ntz": np.dtype("datetime64[us]"),
    "string": str,
    "varchar": str,
    "char": str,
    "binary": bytes,
}


class SparkDataFrameSource(EngineTableSource):
    """The rows of a ``pyspark.sql.DataFrame``, partition after partition.

    A build runs one Spark task per partition, which encodes its rows and writes them as
    chunks into the target storage; the driver only collects what each task wrote.
    Columns map by their Spark type (arrays of numbers become variable-length arrays: pass
    ``schema=`` for fixed shapes) and are taken as holding no nulls, whatever Spark declares
    (it declares most columns nullable): a null names its field, partition and record, and
    ``schema=`` with ``Field(..., nullable=True)`` accepts it.
    """

    kind = "spark"

    @property
    def dataframe(self) -> Any:
        """The ``pyspark.sql.DataFrame``."""
        return self.table

    def engine_schema(self) -> Schema:
        return Schema([spark_field(f.name, f.dataType) for f in self.dataframe.schema.fields])

    def arrow_tables(self) -> Iterator[Any]:
        """Read on the driver, the whole DataFrame at once (a build never does this)."""
        yield self.dataframe.toArrow()


class SparkPartition(Source):
    """In a Spark task: the records of its partition, from the Arrow batches Spark hands it."""

    kind = "spark"

    def __init__(self, schema: Schema, batches: Iterable[Any]) -> None:
        self._schema = schema
        self.batches = batches

    @property
    def schema(self) -> Schema:
        return self._schema

    def column_batches(self) -> Iterator[ColumnBatch]:
        for batch in self.batches:
            yield batch_columns(batch, self._schema)


def spark_field(name: str, spark_type: Any) -> Field:
    """Our Field for a DataFrame column of ``spark_type``: numbers, booleans, dates,
    timestamps, strings, binary, and arrays (of arrays) of numbers."""
    shape: list[int | None] = []
    inner = spark_type
    while inner.typeName() == "array":
        shape.append(None)
        inner = inner.elementType
    kind = _KINDS.get(inner.typeName())
    if kind is None:
        raise SchemaError(
            f"column {name!r}: Spark type {spark_type.simpleString()} is not supported "
            "(numbers, booleans, dates, timestamps, strings, binary and arrays of numbers "
            f"are); cast it (df.withColumn({name!r}, df[{name!r}].cast('double'))), "
            "flatten it, or select other columns"
        )
    if shape and not isinstance(kind, np.dtype):
        raise SchemaError(
            f"column {name!r}: arrays of {inner.simpleString()} are not supported, only arrays "
            "of numbers"
        )
    return Field(name, kind, tuple(shape))
