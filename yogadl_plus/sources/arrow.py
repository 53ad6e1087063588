"""Arrow data as yogadl_plus records: Arrow types as Fields, Arrow batches and tables as records.

What the sources that read Arrow share (Parquet, Petastorm, Ray, Spark); what only one of them
knows (Parquet files and Hive folders, Ray's tensor types, Spark's SQL types) stays in its own
module. pyarrow is imported where it is used, so that importing this module needs no pyarrow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from yogadl_plus.errors import SchemaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.base import ColumnBatch

__all__ = [
    "BATCH_ROWS",
    "ColumnValues",
    "arrow_field",
    "arrow_to_schema",
    "batch_columns",
    "column_values",
    "is_list_type",
]

#: How many rows a source asks for in one Arrow batch when it reads.
BATCH_ROWS = 4096

#: Turns one Arrow column of a batch into the record values of a field (``column_values``, or a
#: source's own when its columns hold an encoding of its own).
ColumnValues = Callable[[Any, Field], Sequence[Any]]


def is_list_type(arrow_type: Any) -> bool:
    """Whether ``arrow_type`` is a list, large list or fixed-size list."""
    import pyarrow.types as pat

    return bool(
        pat.is_list(arrow_type)
        or pat.is_large_list(arrow_type)
        or pat.is_fixed_size_list(arrow_type)
    )


def arrow_field(name: str, arrow_type: Any, nullable: bool) -> Field:
    """Our Field for a column ``name`` of ``arrow_type``, or a SchemaError naming the column:
    fixed-size lists become fixed dims, lists None dims."""
    import pyarrow.types as pat

    shape: list[int | None] = []
    inner = arrow_type
    while is_list_type(inner):
        shape.append(inner.list_size if pat.is_fixed_size_list(inner) else None)
        inner = inner.value_type
    if pat.is_dictionary(inner):
        inner = inner.value_type
    if pat.is_string(inner) or pat.is_large_string(inner):
        kind: Any = str
    elif pat.is_binary(inner) or pat.is_large_binary(inner) or pat.is_fixed_size_binary(inner):
        kind = bytes
    elif pat.is_timestamp(inner):
        kind = np.dtype(f"datetime64[{inner.unit}]")
    elif pat.is_date32(inner):
        kind = np.dtype("datetime64[D]")
    elif pat.is_date64(inner):
        kind = np.dtype("datetime64[ms]")
    elif pat.is_integer(inner) or pat.is_floating(inner) or pat.is_boolean(inner):
        kind = np.dtype(inner.to_pandas_dtype())
    else:
        raise SchemaError(
            f"column {name!r}: Arrow type {arrow_type} is not supported (numbers, bools, "
            "timestamps, strings, binary and (fixed-size) lists of them are); pick other "
            "columns with columns=, or flatten it first"
        )
    if shape and not isinstance(kind, np.dtype):
        raise SchemaError(f"column {name!r}: lists of {kind.__name__} are not supported")
    return Field(name, kind, tuple(shape), nullable=nullable)


def arrow_to_schema(arrow_schema: Any, nullable_columns: set[str] | None = None) -> Schema:
    """A Schema for an Arrow schema: fixed-size lists become fixed dims, lists None dims.

    A column is nullable when ``nullable_columns`` says so (columns that really hold nulls), or,
    when that is not known, when Arrow declares it nullable.
    """
    fields = []
    for f in arrow_schema:
        nullable = f.nullable if nullable_columns is None else f.name in nullable_columns
        fields.append(arrow_field(f.name, f.type, nullable))
    return Schema(fields)


def column_values(column: Any, field: Field) -> Sequence[Any]:
    """One Arrow column of a batch as a sequence of record values for ``field``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        values = column.to_pylist()
        if field.kind != "numeric":
            return values
        return [None if v is None else np.asarray(v, dtype=field.dtype) for v in values]
    if field.kind == "str" or field.kind == "bytes":
        return column.to_pylist()
    if not field.shape:
        return column.to_numpy(zero_copy_only=False)
    if None not in field.shape:
        flat = column
        for size in field.shape:
            lengths = pc.list_value_length(flat)
            if flat.null_count or pc.min_max(lengths).as_py() != {"min": size, "max": size}:
                return column.to_pylist()  # ragged: each record is checked, and named
            flat = flat.flatten()
        if flat.null_count:
            return column.to_pylist()  # a null inside an array: each record is checked
        return flat.to_numpy(zero_copy_only=False).reshape((len(column), *field.shape))
    if field.shape[0] is None and None not in field.shape[1:]:
        split = _split_rows(column, field)
        if split is not None:
            return split
    try:
        if _nulls_inside(column):
            raise ValueError
        return [_array(v, field) for v in column.to_pylist()]
    except (ValueError, TypeError):
        # Values that do not make arrays of the field's dtype (ragged inner lists, a null
        # inside): as they are, for the encoder to name the record and field.
        return column.to_pylist()


def _array(value: Any, field: Field) -> np.ndarray:
    """A list value as an array of the field's rank: an empty list of lists (``[]`` for a
    field of shape (None, None)) has shape (0, 0), not numpy's (0,)."""
    array = np.asarray(value, dtype=field.dtype)
    if array.size == 0 and array.ndim < len(field.shape):
        rest = tuple(0 if d is None else d for d in field.shape[array.ndim :])
        array = array.reshape(array.shape + rest)
    return array


def _split_rows(column: Any, field: Field) -> list[np.ndarray] | None:
    """The values of a list column of shape (None, d1, ...) (no null at the top) as one array
    per row, cut from one flat numpy array instead of built from Python lists (token ids of
    text datasets: thousands of rows a batch); None when some inner list is null or not of
    its fixed size, for the generic path to name the record."""
    import pyarrow.compute as pc

    if not len(column):
        return []
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    flat = column.flatten()  # the values of this batch's rows only, also of a slice
    for size in field.shape[1:]:
        inner = pc.list_value_length(flat)
        if flat.null_count or (
            len(flat) and pc.min_max(inner).as_py() != {"min": size, "max": size}
        ):
            return None  # ragged or null inside: each record is checked, and named
        flat = flat.flatten()
    if flat.null_count:
        return None
    values = flat.to_numpy(zero_copy_only=False).astype(field.dtype, copy=False)
    values = values.reshape((int(lengths.sum()), *field.shape[1:]))
    return np.split(values, np.cumsum(lengths)[:-1])


def _nulls_inside(column: Any) -> bool:
    """Whether the values of a list column hold a null at any depth."""
    while is_list_type(column.type):
        column = column.flatten()
        if column.null_count:
            return True
    return False


def batch_columns(
    batch: Any,
    schema: Schema,
    values: ColumnValues | None = None,
) -> ColumnBatch:
    """An Arrow record batch or table as a batch of columns of ``schema`` (columns named as
    fields), what a build writes a batch at a time; ``values(column, field)`` turns a column
    into record values (default: ours)."""
    convert = values or column_values
    return {f.name: convert(batch.column(f.name), f) for f in schema}, batch.num_rows
