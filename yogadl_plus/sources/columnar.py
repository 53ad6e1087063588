"""Columns already in memory as a source: a dict of numpy arrays, a pandas or polars DataFrame,
a pyarrow Table, RecordBatchReader or dataset, each cached in one call.

The schema comes from the columns' types, not from reading rows: a numpy array of ``n`` rows
of shape ``(n, d1, ...)`` is a fixed-shape field of shape ``(d1, ...)``, an array of str a string
field, Arrow types as ``sources/arrow.py`` maps them. Columns of objects (numpy arrays of other
shapes, strings, bytes, None) are the one exception: their values are looked at, since their
type says nothing. The build then takes the rows a batch of columns at a time
(``column_batches``), so the cache's writer encodes a whole batch per call; no record is made a
dict on the way.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from yogadl_plus.errors import SchemaError
from yogadl_plus.schema import Field, Schema, infer_field, infer_value
from yogadl_plus.sources.arrow import (
    arrow_field,
    check_file_types,
    column_values,
    refused_cast,
)
from yogadl_plus.sources.base import (
    ColumnBatch,
    Piece,
    Source,
    even_cuts,
    even_ranges,
)

__all__ = ["ColumnsSource", "columns_source", "is_columns"]

#: Rows per batch of columns handed to the writer.
BATCH_ROWS = 8192
# numpy kinds stored as they are: bools, integers, floats, complex, datetimes, timedeltas.
_NUMERIC_KINDS = "biufcmM"


class Column:
    """One field's values for rows ``[0, len)``: ``values(start, stop)`` gives a batch's (an
    array of rows for a fixed-shape field, else a sequence of values, None for a null)."""

    def __init__(self, field: Field, data: Any) -> None:
        self.field = field
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def values(self, start: int, stop: int) -> Any:
        part = self.data[start:stop]
        if isinstance(part, np.ndarray) and part.dtype.kind not in _NUMERIC_KINDS:
            return part.tolist()  # str, bytes, objects: as Python values
        return part

    def sliced(self, start: int, stop: int) -> Column:
        """Rows ``[start, stop)`` as a column of their own, holding only their data (a part of
        a parallel build is pickled to its worker)."""
        part = self.data[start:stop]
        return Column(self.field, part.copy() if isinstance(part, np.ndarray) else list(part))


class ArrowColumn(Column):
    """A column of a pyarrow Table (a ChunkedArray)."""

    def values(self, start: int, stop: int) -> Any:
        return column_values(self.data.slice(start, stop - start), self.field)

    def sliced(self, start: int, stop: int) -> Column:
        import pyarrow as pa

        # (Concatenated into new buffers: a slice would pickle its parent's whole buffers.)
        chunks = self.data.slice(start, stop - start).chunks
        return ArrowColumn(self.field, pa.chunked_array([pa.concat_arrays(chunks)], self.data.type))


class ColumnsSource(Piece):
    """Equal-length columns, one per field, read a batch of rows at a time (a part of a parallel
    build is one too: its rows start at ``start`` of the whole)."""

    def __init__(self, columns: Sequence[Column], kind: str, offset: int = 0) -> None:
        self.columns = list(columns)
        self.kind = kind
        super().__init__(Schema([c.field for c in self.columns]), offset, len(self.columns[0]))

    def __repr__(self) -> str:
        return f"ColumnsSource({self.kind}, rows {self.start}..{self.start + self.rows})"

    def column_batches(self) -> Iterator[ColumnBatch]:
        for start in range(0, self.rows, BATCH_ROWS):
            stop = min(start + BATCH_ROWS, self.rows)
            yield {c.field.name: c.values(start, stop) for c in self.columns}, stop - start

    def split(self, parts: int) -> list[Source]:
        return [
            ColumnsSource(
                [c.sliced(r.start, r.stop) for c in self.columns], self.kind, self.start + r.start
            )
            for r in even_ranges(self.rows, parts)
        ]


class ArrowBatchesSource(Source):
    """The batches of a pyarrow RecordBatchReader (read once, in order) or dataset (its
    fragments, split between the tasks of a parallel build)."""

    def __init__(
        self,
        batches: Any,
        arrow_schema: Any,
        length: int | None,
        kind: str,
        fragments: list[Any] | None = None,
        offset: int = 0,
    ) -> None:
        self._batches = batches
        self._arrow_schema = arrow_schema
        self._schema = Schema(
            [arrow_field(f.name, f.type, f.nullable) for f in _named(arrow_schema)]
        )
        self._length = length
        self.kind = kind
        self._fragments = fragments
        self.offset = self.start = offset

    def split(self, parts: int) -> list[Source] | None:
        if self._fragments is None:
            return None
        counts = [f.count_rows() for f in self._fragments]
        pieces: list[Source] = []
        for run in even_cuts(counts, parts):
            fragments = self._fragments[run.start : run.stop]
            rows = sum(counts[run.start : run.stop])
            start = self.start + sum(counts[: run.start])
            batches = functools.partial(_fragment_batches, fragments, self._arrow_schema)
            pieces.append(
                ArrowBatchesSource(batches, self._arrow_schema, rows, self.kind, fragments, start)
            )
        return pieces

    @property
    def schema(self) -> Schema:
        return self._schema

    @property
    def length(self) -> int | None:
        return self._length

    def column_batches(self) -> Iterator[ColumnBatch]:
        fields = self._schema.fields
        for batch in self._batches():
            if batch.num_rows:
                columns = {f.name: column_values(batch.column(f.name), f) for f in fields}
                yield columns, batch.num_rows


# --- what a user passes ---


def is_columns(obj: Any) -> bool:
    """Whether ``obj`` is columns in memory: a dict (of columns), a pandas or polars DataFrame,
    or a pyarrow Table, RecordBatchReader or dataset."""
    if isinstance(obj, Mapping):
        return True
    module = type(obj).__module__.split(".")[0]
    name = type(obj).__name__
    if module == "pandas":
        return name == "DataFrame"
    if module == "polars":
        return name == "DataFrame"
    if module == "pyarrow":
        return name in ("Table", "RecordBatch", "RecordBatchReader") or _is_arrow_dataset(obj)
    return False


def columns_source(obj: Any, schema: Schema | None = None) -> Source:
    """The source for columns in memory (``is_columns``); SchemaError naming the column that
    cannot be cached as it is, before anything is written. With ``schema``, the columns take
    their fields from it (checked as they are written) and must be its fields."""
    if isinstance(obj, Mapping):
        given = _given(schema, list(obj))
        return ColumnsSource(_dict_columns(obj, given), "numpy")
    module = type(obj).__module__.split(".")[0]
    if module == "pandas":
        return ColumnsSource(_pandas_columns(obj, _given(schema, list(obj.columns))), "pandas")
    if module == "polars":
        return ColumnsSource(_polars_columns(obj, _given(schema, list(obj.columns))), "polars")
    import pyarrow as pa

    if isinstance(obj, (pa.Table, pa.RecordBatch)):
        table = obj if isinstance(obj, pa.Table) else pa.Table.from_batches([obj])
        return ColumnsSource(_table_columns(table, _given(schema, table.column_names)), "arrow")
    if isinstance(obj, pa.RecordBatchReader):
        return ArrowBatchesSource(_once(obj), obj.schema, None, "arrow")
    fragments = list(obj.get_fragments())
    batches = functools.partial(_fragment_batches, fragments, obj.schema)
    return ArrowBatchesSource(batches, obj.schema, obj.count_rows(), "arrow-dataset", fragments)


def _given(schema: Schema | None, names: list[Any]) -> dict[str, Field] | None:
    """The given schema's fields by name, when it has exactly these columns' names."""
    if schema is None:
        return None
    missing = [n for n in schema.names if n not in names]
    extra = [n for n in names if n not in schema.names]
    if missing or extra:
        said = [f"no column for field(s) {missing}"] if missing else []
        said += [f"column(s) {extra} not in the schema"] if extra else []
        raise SchemaError(f"the columns do not match the schema: {' and '.join(said)}")
    return {f.name: f for f in schema}


def _fragment_batches(fragments: list[Any], arrow_schema: Any) -> Iterator[Any]:
    """The batches of a dataset's ``fragments``, in order, as columns of ``arrow_schema``;
    a SchemaError names a file whose column has another type."""
    import pyarrow as pa

    for fragment in fragments:
        where = getattr(fragment, "path", "a fragment in memory")
        casts = check_file_types(where, fragment.physical_schema, arrow_schema)
        try:
            yield from fragment.to_batches(schema=arrow_schema)
        except pa.ArrowInvalid as exc:
            raise refused_cast(where, casts, exc) from None


def _is_arrow_dataset(obj: Any) -> bool:
    return type(obj).__module__.startswith("pyarrow._dataset") and hasattr(obj, "to_batches")


def _once(reader: Any) -> Any:
    """A batches callable for a reader, which can be read only once."""

    def batches() -> Iterator[Any]:
        if getattr(batches, "read", False):
            raise ValueError("a RecordBatchReader can be read only once; pass a new one")
        batches.read = True  # type: ignore[attr-defined]
        yield from reader

    return batches


def _named(arrow_schema: Any) -> Any:
    for f in arrow_schema:
        _check_name(f.name)
    return arrow_schema


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise SchemaError(
            f"column names are field names, non-empty strs: got {name!r} "
            f"({type(name).__name__}); rename the column"
        )
    return name


def _check_lengths(lengths: Mapping[str, int]) -> None:
    if not lengths:
        raise SchemaError("no columns: pass at least one column (field name -> values)")
    first, rows = next(iter(lengths.items()))
    for name, length in lengths.items():
        if length != rows:
            raise SchemaError(
                f"column {name!r} has {length} rows but column {first!r} has {rows}: every "
                "column needs one value per record"
            )


# --- a dict of numpy arrays (or sequences) ---


def _dict_columns(columns: Mapping[Any, Any], given: dict[str, Field] | None) -> list[Column]:
    out = []
    lengths = {}
    for name, data in columns.items():
        _check_name(name)
        if given is not None:  # (the values are checked against it as they are written)
            column = Column(given[name], data if hasattr(data, "__len__") else [data])
        else:
            column = _numpy_column(name, data)
        out.append(column)
        lengths[name] = len(column)
    _check_lengths(lengths)
    return out


def _numpy_column(name: str, data: Any) -> Column:
    """A column for a numpy array, or a sequence of values (made an array where numpy takes it
    as one of numbers or strings; else its values are looked at)."""
    if isinstance(data, np.generic):
        data = np.asarray(data)
    if not isinstance(data, np.ndarray):
        if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
            raise SchemaError(
                f"column {name!r}: expected a numpy array or a sequence of one value per "
                f"record, got {type(data).__name__}"
            )
        values = list(data)
        array = _plain_array(name, values)
        if array is None:
            return _object_column(name, values)
        data = array
    if data.ndim == 0:
        raise SchemaError(
            f"column {name!r}: got a 0-d array; a column holds one value per record (shape "
            "(records, ...))"
        )
    kind = data.dtype.kind
    if data.dtype.fields is not None:
        raise SchemaError(
            f"column {name!r}: structured dtype {data.dtype}: pass each of its fields as a "
            "column of its own"
        )
    if kind in _NUMERIC_KINDS:
        dtype = data.dtype.newbyteorder("=") if data.dtype.byteorder == ">" else data.dtype
        return Column(Field(name, dtype, tuple(data.shape[1:])), data)
    if kind in "US":
        if data.ndim != 1:
            raise SchemaError(
                f"column {name!r}: an array of strings of shape {data.shape}; a string field "
                "holds one string per record (shape (records,))"
            )
        return Column(Field(name, str if kind == "U" else bytes), data)
    if kind == "O":
        if data.ndim != 1:
            raise SchemaError(
                f"column {name!r}: an object array of shape {data.shape}; give one object per "
                "record (shape (records,))"
            )
        return _object_column(name, data.tolist())
    raise SchemaError(f"column {name!r}: numpy dtype {data.dtype} cannot be cached")


def _plain_array(name: str, values: list[Any]) -> np.ndarray | None:
    """``values`` as one numpy array when they are all numbers or rows of numbers of one
    shape, holding every value exactly; None otherwise (strings, None values, mixed types,
    arrays of differing shapes)."""
    if not values:
        return None
    first = values[0]
    if isinstance(first, (str, bytes, bytearray)) or first is None:
        return None
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):
        return None
    if array.dtype.kind not in _NUMERIC_KINDS:
        return None
    if array.dtype.kind in "fc" and array.size:
        # numpy makes floats of ints among floats, rounding those beyond the mantissa: such
        # a column is refused as a generator's records would be, naming the record.
        with np.errstate(invalid="ignore"):
            rounds = np.abs(array) >= 2.0 ** (np.finfo(array.dtype).nmant + 1)
        if rounds.any():
            _check_values(Field(name, array.dtype, array.shape[1:]), values)
    return array


def _check_values(field: Field, values: Sequence[Any]) -> None:
    """A SchemaError naming the first record whose value ``field`` cannot hold exactly."""
    convert = field.converter()
    for index, value in enumerate(values):
        try:
            convert(value)
        except ValueError as exc:
            raise SchemaError(
                f"record {index}, field {field.name!r}: expected {field.describe()}, {exc}"
            ) from None


def _object_column(name: str, values: list[Any]) -> Column:
    """A column of Python objects: its field found from the values as a generator's records'
    fields are (their type, and for arrays their shapes and dtypes), nullable where some are
    None. The values stay as they are, each converted exactly as it is written."""
    if not values:
        raise SchemaError(
            f"column {name!r} is empty, and an empty list or object column says nothing of its "
            "type: pass schema=, or a numpy array (whose dtype says it)"
        )
    # Strings stay Python str (a numpy array of them would drop trailing NULs and take rows x
    # the longest), found at once where they are all a column holds.
    kinds = set(map(type, values))
    for kind in (str, bytes):
        if kind in kinds and kinds <= {kind, type(None)}:
            return Column(Field(name, kind, nullable=type(None) in kinds), values)
    found = [infer_value(name, v, i) for i, v in enumerate(values) if v is not None]
    if not found:
        raise SchemaError(f"column {name!r}: every value is None; leave the column out")
    return Column(infer_field(name, found, len(found) != len(values)), values)


# --- pandas, polars and Arrow ---


def _pandas_columns(frame: Any, given: dict[str, Field] | None) -> list[Column]:
    import pyarrow as pa

    out = []
    lengths = {}
    for name in frame.columns:
        _check_name(name)
        series = frame[name]
        if not hasattr(series, "dtype"):
            raise SchemaError(f"column {name!r} appears more than once; rename one")
        dtype = series.dtype
        if isinstance(dtype, np.dtype) and dtype.kind in _NUMERIC_KINDS + "O":
            data = series.to_numpy()
            if given is not None:
                column = Column(given[name], data if dtype.kind != "O" else data.tolist())
            else:
                column = _numpy_column(name, data)
        else:  # pandas' own dtypes (nullable numbers, strings, categories, time zones)
            try:
                array = pa.chunked_array([pa.array(series, from_pandas=True)])
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise SchemaError(f"column {name!r}: pandas dtype {dtype}: {exc}") from None
            column = _arrow_column(name, array, given)
        out.append(column)
        lengths[name] = len(column)
    _check_lengths(lengths)
    return out


def _polars_columns(frame: Any, given: dict[str, Field] | None) -> list[Column]:
    """A polars frame's columns through Arrow, but for its ``Object`` columns: those hold
    Python objects (Arrow would get their pointers), taken as a pandas object column's are."""
    import polars as pl

    objects = [name for name, dtype in frame.schema.items() if dtype == pl.Object]
    table = frame.drop(objects).to_arrow()
    out = []
    for name in frame.columns:
        if name not in objects:
            out.append(_arrow_column(_check_name(name), table.column(name), given))
            continue
        values = frame.get_column(name).to_list()
        out.append(
            Column(given[name], values) if given is not None else _object_column(name, values)
        )
    _check_lengths({c.field.name: len(c) for c in out})
    return out


def _table_columns(table: Any, given: dict[str, Field] | None) -> list[Column]:
    names = table.column_names
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise SchemaError(f"columns {twice} appear more than once; rename them")
    columns = [_arrow_column(_check_name(n), table.column(n), given) for n in names]
    _check_lengths({c.field.name: len(c) for c in columns})
    return columns


def _arrow_column(name: str, array: Any, given: dict[str, Field] | None = None) -> Column:
    """A column for an Arrow ChunkedArray: its field given, or from the Arrow type, nullable
    when it holds a null (Arrow counts them without reading the values)."""
    if given is not None:
        return ArrowColumn(given[name], array)
    return ArrowColumn(arrow_field(name, array.type, array.null_count > 0), array)
