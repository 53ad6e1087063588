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
    "check_file_types",
    "refused_cast",
    "column_values",
    "is_list_type",
]

#: How many rows a source asks for in one Arrow batch when it reads.
BATCH_ROWS = 4096
# Arrow's timestamp units, coarsest first.
_UNITS = ("s", "ms", "us", "ns")

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


def check_file_types(path: str, file_schema: Any, arrow_schema: Any) -> list[str]:
    """A SchemaError unless each column of the file ``path`` (of ``file_schema``) that
    ``arrow_schema`` (the whole dataset's) also has is of its type there, or of one that Arrow
    casts to it keeping every value (a narrower float, another string encoding) or refusing a
    value it cannot hold (any int to any int). The casts of the second kind, in words ("column
    'id' int64 to int32"): what ``refused_cast`` names if a value does not fit."""
    checked = []
    for want in arrow_schema:
        index = file_schema.get_field_index(want.name)
        if index < 0:
            continue  # a column this file lacks: nulls (Arrow's dataset readers add them)
        got = file_schema.field(index).type
        if got.equals(want.type):
            continue
        if not _casts_exactly(got, want.type):
            raise SchemaError(
                f"{path}: column {want.name!r} is {got} in this file but {want.type} in the "
                f"dataset's schema {_HOLD_EVERY_VALUE}, and casting it could change values: "
                f"cache pyarrow.dataset.dataset(files, schema=...) with a type that holds every "
                f"file's values, or rewrite this file's column as {want.type}"
            )
        checked.append(f"column {want.name!r} {got} to {want.type}")
    return checked


def refused_cast(where: str, casts: list[str], exc: Exception) -> SchemaError:
    """The error for a value that Arrow refused to cast to the dataset's type while reading
    ``where`` (one file, or the files whose ``casts`` made it possible)."""
    return SchemaError(
        f"{where}: a value does not fit the dataset's type ({exc}); the casts it needed: "
        f"{'; '.join(casts) or 'none'}. The dataset's schema {_HOLD_EVERY_VALUE}: cache "
        "pyarrow.dataset.dataset(files, schema=...) with a type that holds every file's values"
    )


# (Where a dataset's types come from, for the messages above.)
_HOLD_EVERY_VALUE = "(which pyarrow takes from one file unless it is given)"


def _casts_exactly(got: Any, want: Any) -> bool:
    """Whether Arrow's cast of ``got`` values to ``want`` keeps every value, or fails on one it
    cannot hold (an int out of range, a timestamp that overflows): never another value."""
    import pyarrow.types as pat

    if got.equals(want) or pat.is_null(got):
        return True
    if pat.is_dictionary(got):
        return _casts_exactly(got.value_type, want)
    if pat.is_dictionary(want):
        return _casts_exactly(got, want.value_type)
    if pat.is_integer(got) and pat.is_integer(want):  # (Arrow refuses a value out of range)
        return True
    if pat.is_floating(got) and pat.is_floating(want):
        return bool(got.bit_width <= want.bit_width)
    if pat.is_timestamp(got) and pat.is_timestamp(want):  # (Arrow refuses an overflow)
        return bool(_UNITS.index(got.unit) <= _UNITS.index(want.unit))
    if (_is_text(got) and _is_text(want)) or (_is_binary(got) and _is_binary(want)):
        return True
    if pat.is_fixed_size_list(got) or pat.is_fixed_size_list(want):
        if not (pat.is_fixed_size_list(got) and pat.is_fixed_size_list(want)):
            return False
        return bool(got.list_size == want.list_size) and _casts_exactly(
            got.value_type, want.value_type
        )
    if is_list_type(got) and is_list_type(want):
        return _casts_exactly(got.value_type, want.value_type)
    return False


def _is_text(arrow_type: Any) -> bool:
    import pyarrow.types as pat

    return bool(pat.is_string(arrow_type) or pat.is_large_string(arrow_type))


def _is_binary(arrow_type: Any) -> bool:
    import pyarrow.types as pat

    return bool(pat.is_binary(arrow_type) or pat.is_large_binary(arrow_type))


def column_values(column: Any, field: Field) -> Sequence[Any]:
    """One Arrow column of a batch as a sequence of record values for ``field``, every value
    exact: numbers and timestamps through numpy (nanoseconds stay nanoseconds), a null row as
    None. A row that holds no array (a null inside its lists, or lists of differing lengths
    side by side) is given as its Python value, for the encoder to refuse naming the record
    and field."""
    import pyarrow as pa
    import pyarrow.types as pat

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if field.kind != "numeric":
        return column.to_pylist()
    if pat.is_dictionary(column.type):
        column = column.dictionary_decode()
    if not column.null_count:
        return _present_values(column, field)
    valid = column.is_valid()
    rows = np.flatnonzero(valid.to_numpy(zero_copy_only=False)).tolist()
    out: list[Any] = [None] * len(column)
    for row, value in zip(rows, _present_values(column.filter(valid), field)):
        out[row] = value
    return out


def _present_values(column: Any, field: Field) -> Any:
    """``column_values`` of a column without a null row: an array of the rows where they make
    one of the field's shape (a fixed-shape field's fast path), else a value per row."""
    if not is_list_type(column.type):
        return _numbers(column)
    inside = _rows_with_nulls_inside(column)
    if inside is None:
        return _list_values(column, field)
    out = _python_rows(column)  # (the rows with a null inside: as they are)
    good = np.flatnonzero(~inside)
    for row, value in zip(good.tolist(), _list_values(column.take(good), field)):
        out[row] = value
    return out


def _numbers(array: Any) -> np.ndarray:
    """A flat Arrow array without nulls as numpy values of its own type: numbers, bools,
    timestamps and dates as datetime64 of their unit."""
    import pyarrow.types as pat

    if pat.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array.to_numpy(zero_copy_only=False)


def _list_values(column: Any, field: Field) -> Any:
    """The rows of a list column without nulls at any depth, each an array of the shape its
    nested lists make (an empty list of lists has shape (0, 0), of fixed-size lists of 3
    (0, 3)); a ragged row as its Python lists. One array of all rows when every row has the
    same shape and the field has no None dim."""
    values, shapes, sizes, ragged = _flattened(column, field.shape)
    rows = len(column)
    if rows and not ragged.any() and (shapes == shapes[0]).all():
        whole = values.reshape((rows, *shapes[0].tolist()))
        return whole if None not in field.shape else list(whole)
    ends = np.cumsum(sizes).tolist()
    starts = [0, *ends[:-1]]
    if shapes.shape[1] == 1:  # lists of numbers: never ragged, each slice is its row
        return [values[a:b] for a, b in zip(starts, ends)]
    return [
        _python_rows(column.slice(row, 1))[0] if ragged[row] else values[a:b].reshape(shape)
        for row, (a, b, shape) in enumerate(zip(starts, ends, shapes.tolist()))
    ]


def _python_rows(column: Any) -> list[Any]:
    """The rows of a list column as Python lists, for the encoder to refuse (a null inside,
    ragged lists): timestamps and dates as their numbers, which any value of theirs is (a
    Python datetime is not: years 1 to 9999, microseconds)."""
    import pyarrow as pa
    import pyarrow.types as pat

    inner = [column.type]
    while is_list_type(inner[-1]):
        inner.append(inner[-1].value_type)
    if pat.is_temporal(inner[-1]):
        ints: Any = pa.int32() if pat.is_date32(inner[-1]) else pa.int64()
        for outer in reversed(inner[:-1]):
            size = outer.list_size if pat.is_fixed_size_list(outer) else -1
            ints = pa.large_list(ints) if pat.is_large_list(outer) else pa.list_(ints, size)
        column = column.cast(ints)
    return column.to_pylist()


def _flattened(
    column: Any, shape: tuple[int | None, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A list column without nulls at any depth as (its innermost values, one shape per row
    (rows x depth), how many of the values each row holds, which rows are ragged: inner
    lists of differing lengths side by side). A dim of a row whose lists at that depth are
    all empty is the list size, else what the field's ``shape`` says (0 where it says None):
    no list says it."""
    import pyarrow.compute as pc
    import pyarrow.types as pat

    rows = len(column)
    counts = np.ones(rows, np.int64)  # how many lists each row holds at the current depth
    ragged = np.zeros(rows, bool)
    dims = []
    level = column
    while is_list_type(level.type):
        if pat.is_fixed_size_list(level.type):
            dims.append(np.full(rows, level.type.list_size, np.int64))
            counts = counts * level.type.list_size
            level = level.flatten()
            continue
        lengths = pc.list_value_length(level).to_numpy(zero_copy_only=False).astype(np.int64)
        ends = np.cumsum(counts)
        said = shape[len(dims)] if len(dims) < len(shape) else None
        dim = np.full(rows, said or 0, np.int64)
        held = counts > 0
        dim[held] = lengths[(ends - counts)[held]]  # each row's first list's length
        if dims:  # a row's lists at this depth side by side: any other length is ragged
            odd = np.flatnonzero(lengths != np.repeat(dim, counts))
            ragged[np.searchsorted(ends, odd, side="right")] = True
        dims.append(dim)
        total = np.concatenate(([0], np.cumsum(lengths)))
        counts = total[ends] - total[ends - counts]
        level = level.flatten()
    return _numbers(level), np.stack(dims, axis=1), counts, ragged


def _rows_with_nulls_inside(column: Any) -> np.ndarray | None:
    """Which rows of a list column (no null row) hold a null at any depth; None when none."""
    import pyarrow.compute as pc

    level = column
    while is_list_type(level.type):
        level = level.flatten()
        if level.null_count:
            break
    else:
        return None
    rows = len(column)
    owner = np.arange(rows)
    inside = np.zeros(rows, bool)
    level = column
    while is_list_type(level.type):
        owner = owner[pc.list_parent_indices(level).to_numpy(zero_copy_only=False)]
        level = level.flatten()
        if level.null_count:
            inside[owner[~level.is_valid().to_numpy(zero_copy_only=False)]] = True
    return inside


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
