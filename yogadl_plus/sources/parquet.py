"""Parquet files, a directory of them, a glob or a list, read with pyarrow's dataset API."""

from __future__ import annotations

import functools
import glob as globlib
import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from yogadl_plus.errors import SchemaError, YogaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.base import Source

__all__ = ["ParquetSource", "arrow_to_schema"]

_BATCH_ROWS = 4096


def _is_list(arrow_type: Any) -> bool:
    import pyarrow.types as pat

    return bool(
        pat.is_list(arrow_type)
        or pat.is_large_list(arrow_type)
        or pat.is_fixed_size_list(arrow_type)
    )


def _arrow_field(name: str, arrow_type: Any, nullable: bool) -> Field:
    import pyarrow.types as pat

    shape: list[int | None] = []
    inner = arrow_type
    while _is_list(inner):
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
        fields.append(_arrow_field(f.name, f.type, nullable))
    return Schema(fields)


def _column_values(column: Any, field: Field) -> Sequence[Any]:
    """One Arrow column of a batch as a sequence of record values for ``field``."""
    import pyarrow as pa

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
        for _ in field.shape:
            flat = flat.flatten()
        return flat.to_numpy(zero_copy_only=False).reshape((len(column), *field.shape))
    return [np.asarray(v, dtype=field.dtype) for v in column.to_pylist()]


class ParquetSource(Source):
    """Parquet data: a file, a directory, a glob, a ``file://`` URL, or a list of those.

    ``columns`` caches only those columns, in that order.
    """

    kind = "parquet"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        columns: Sequence[str] | None = None,
    ) -> None:
        self.paths = self._expand(paths)
        self.columns = list(columns) if columns is not None else None
        import pyarrow.dataset as pads

        self._dataset = pads.dataset(self.paths, format="parquet")
        if self.columns is not None:
            missing = [c for c in self.columns if c not in self._dataset.schema.names]
            if missing:
                raise SchemaError(
                    f"columns {missing} are not in the Parquet data; "
                    f"it has {self._dataset.schema.names}"
                )

    @staticmethod
    def _expand(paths: Any) -> list[str]:
        items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        files: list[str] = []
        for item in items:
            text = os.fspath(item)
            if text.startswith("file://"):
                text = text[len("file://") :]
            elif "://" in text:
                raise YogaError(
                    f"{text}: only local Parquet paths and file:// URLs are supported "
                    "in this release"
                )
            if any(ch in text for ch in "*?["):
                matched = sorted(globlib.glob(text, recursive=True))
                if not matched:
                    raise YogaError(f"Parquet glob {text!r} matches no file")
                files.extend(matched)
            elif os.path.isdir(text):
                found = sorted(
                    os.path.join(d, f)
                    for d, _, names in os.walk(text)
                    for f in names
                    if f.endswith(".parquet") or f.endswith(".parq")
                )
                if not found:
                    raise YogaError(f"Parquet directory {text!r} holds no *.parquet file")
                files.extend(found)
            elif os.path.exists(text):
                files.append(text)
            else:
                raise YogaError(f"Parquet path {text!r} does not exist")
        return files

    @property
    def arrow_schema(self) -> Any:
        schema = self._dataset.schema
        if self.columns is not None:
            import pyarrow as pa

            schema = pa.schema([schema.field(c) for c in self.columns])
        return schema

    def _columns_with_nulls(self) -> set[str] | None:
        """Columns that hold nulls, from row-group statistics; None if some are absent.

        For list columns the leaf statistics also count empty lists, so a list column whose
        statistics report nulls has its top-level validity checked for real.
        """
        import pyarrow.parquet as pq

        reported: set[str] = set()
        names = set(self.arrow_schema.names)
        for path in self.paths:
            meta = pq.ParquetFile(path).metadata
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                for c in range(group.num_columns):
                    column = group.column(c)
                    name = column.path_in_schema.split(".")[0]
                    if name not in names:
                        continue
                    stats = column.statistics
                    if stats is None or not stats.has_null_count:
                        return None
                    if stats.null_count:
                        reported.add(name)
        nested = {n for n in reported if _is_list(self.arrow_schema.field(n).type)}
        if nested:
            data = self._dataset.to_table(columns=sorted(nested))
            reported -= {n for n in nested if data.column(n).null_count == 0}
        return reported

    @functools.cached_property
    def schema(self) -> Schema:
        return arrow_to_schema(self.arrow_schema, self._columns_with_nulls())

    @property
    def length(self) -> int | None:
        return int(self._dataset.count_rows())

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for path in self.paths:
            st = os.stat(path)
            digest.update(f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        if self.columns is not None:
            digest.update(("columns:" + ",".join(self.columns)).encode())
        return "parquet-sha256:" + digest.hexdigest()[:32]

    def records(self) -> Iterator[Mapping[str, Any]]:
        schema = self.schema
        names = list(schema.names)
        scanner = self._dataset.scanner(columns=names, batch_size=_BATCH_ROWS)
        for batch in scanner.to_batches():
            columns = [_column_values(batch.column(i), schema[n]) for i, n in enumerate(names)]
            for row in zip(*columns):
                yield dict(zip(names, row))
