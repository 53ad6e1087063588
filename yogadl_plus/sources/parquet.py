"""Parquet files, a directory of them, a glob or a list, local or on S3 / GCS, read with
pyarrow's dataset API and filesystems."""

from __future__ import annotations

import fnmatch
import functools
import glob as globlib
import hashlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from yogadl_plus.errors import SchemaError, YogaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.base import Piece, Source, even_cuts

__all__ = ["ParquetSource", "arrow_to_schema", "batch_records", "column_values", "resolve_paths"]

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
    try:
        if _nulls_inside(column):
            raise ValueError
        return [np.asarray(v, dtype=field.dtype) for v in column.to_pylist()]
    except (ValueError, TypeError):
        # Values that do not make arrays of the field's dtype (ragged inner lists, a null
        # inside): as they are, for the encoder to name the record and field.
        return column.to_pylist()


def _nulls_inside(column: Any) -> bool:
    """Whether the values of a list column hold a null at any depth."""
    while _is_list(column.type):
        column = column.flatten()
        if column.null_count:
            return True
    return False


class ParquetSource(Source):
    """Parquet data: a file, a directory, a glob, a ``file://``, ``s3://`` or ``gs://`` URL, or
    a list of those (all on one filesystem).

    ``columns`` caches only those columns, in that order. ``filesystem`` (a ``pyarrow.fs``
    filesystem) reads bucket paths through it, for endpoints and credentials of your own;
    without it, ``s3://`` and ``gs://`` URLs use pyarrow's standard credential chains.
    """

    kind = "parquet"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        columns: Sequence[str] | None = None,
        filesystem: Any = None,
    ) -> None:
        self.filesystem, self.paths = _expand(paths, filesystem)
        self.columns = list(columns) if columns is not None else None
        #: Arrow column -> record values of a field (a subclass decodes its own encodings).
        self.values: Callable[[Any, Field], Sequence[Any]] = column_values
        import pyarrow.dataset as pads

        try:
            self._dataset = pads.dataset(self.paths, format="parquet", filesystem=self.filesystem)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise YogaError(f"cannot read the Parquet data {paths!r}: {exc}") from exc
        if self.columns is not None:
            missing = [c for c in self.columns if c not in self._dataset.schema.names]
            if missing:
                raise SchemaError(
                    f"columns {missing} are not in the Parquet data; "
                    f"it has {self._dataset.schema.names}"
                )

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
        reported: set[str] = set()
        names = set(self.arrow_schema.names)
        for meta in self._footers:
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
    def _footers(self) -> list[Any]:
        """Each file's Parquet metadata, read once (null statistics and row groups)."""
        import pyarrow.parquet as pq

        footers = []
        for path in self.paths:
            with self.filesystem.open_input_file(path) as f:
                footers.append(pq.ParquetFile(f).metadata)
        return footers

    @functools.cached_property
    def schema(self) -> Schema:
        return arrow_to_schema(self.arrow_schema, self._columns_with_nulls())

    @property
    def length(self) -> int | None:
        return int(self._dataset.count_rows())

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for info in self.filesystem.get_file_info(self.paths):
            mtime = info.mtime_ns if info.mtime_ns is not None else ""
            name = info.path  # local paths as before, so existing fingerprints still match
            if self.filesystem.type_name != "local":
                name = f"{self.filesystem.type_name}://{name}"
            digest.update(f"{name}\0{info.size}\0{mtime}\n".encode())
        if self.columns is not None:
            digest.update(("columns:" + ",".join(self.columns)).encode())
        return "parquet-sha256:" + digest.hexdigest()[:32]

    def records(self) -> Iterator[Mapping[str, Any]]:
        scanner = self._dataset.scanner(columns=list(self.schema.names), batch_size=_BATCH_ROWS)
        for batch in scanner.to_batches():
            yield from batch_records(batch, self.schema, self.values)

    def split(self, parts: int) -> list[Source]:
        """Runs of whole row groups, balanced by rows (a row group is never cut)."""
        groups: list[tuple[str, int, int]] = []  # (file, row group, rows), in reading order
        for path, meta in zip(self.paths, self._footers):
            groups += [(path, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
        groups = [g for g in groups if g[2]]
        pieces: list[Source] = []
        offset = 0
        for run in even_cuts([rows for _, _, rows in groups], parts):
            selection: dict[str, list[int]] = {}
            for path, group, _ in (groups[i] for i in run):
                selection.setdefault(path, []).append(group)
            rows = sum(groups[i][2] for i in run)
            pieces.append(
                _ParquetPiece(
                    self.filesystem,
                    selection,
                    self.schema,
                    self.arrow_schema,
                    offset,
                    rows,
                    self.values,
                    self.kind,
                )
            )
            offset += rows
        return pieces


class _ParquetPiece(Piece):
    """Some row groups of some files of a ParquetSource, read with its schema: each file's
    columns are cast to the dataset's types, as the dataset scanner of a serial build does."""

    kind = "parquet"

    def __init__(
        self,
        filesystem: Any,
        selection: dict[str, list[int]],
        schema: Schema,
        arrow_schema: Any,
        offset: int,
        rows: int,
        values: Callable[[Any, Field], Sequence[Any]],
        kind: str,
    ) -> None:
        super().__init__(schema, offset, rows)
        self.filesystem = filesystem
        self.selection = selection
        self.arrow_schema = arrow_schema
        self.values = values
        self.kind = kind

    def __repr__(self) -> str:
        return f"<Parquet rows {self.start}..{self.start + self.rows} of {list(self.selection)}>"

    def records(self) -> Iterator[Mapping[str, Any]]:
        import pyarrow.parquet as pq

        names = list(self._schema.names)
        for path, groups in self.selection.items():
            with self.filesystem.open_input_file(path) as f:
                batches = pq.ParquetFile(f).iter_batches(
                    batch_size=_BATCH_ROWS, row_groups=groups, columns=names
                )
                for batch in batches:
                    table = self._as_dataset_types(batch, path)
                    yield from batch_records(table, self._schema, self.values)

    def _as_dataset_types(self, batch: Any, path: str) -> Any:
        import pyarrow as pa

        table = pa.Table.from_batches([batch]).select(self.arrow_schema.names)
        if table.schema.equals(self.arrow_schema):
            return table
        try:
            return table.cast(self.arrow_schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(
                f"{path}: its columns {table.schema} do not convert to the dataset's "
                f"{self.arrow_schema}: {exc}"
            ) from exc


def batch_records(
    batch: Any,
    schema: Schema,
    values: Callable[[Any, Field], Sequence[Any]] | None = None,
) -> Iterator[dict[str, Any]]:
    """The rows of an Arrow record batch or table as records of ``schema`` (columns named as
    fields); ``values(column, field)`` turns a column into record values (default: ours)."""
    names = list(schema.names)
    convert = values or column_values
    columns = [convert(batch.column(n), schema[n]) for n in names]
    for row in zip(*columns):
        yield dict(zip(names, row))


def _expand(paths: Any, filesystem: Any) -> tuple[Any, list[str]]:
    """(the filesystem, the sorted Parquet file paths on it) for what the user named."""
    filesystem, named = resolve_paths(paths, filesystem)
    if filesystem.type_name == "local":
        return filesystem, [os.path.abspath(f) for p in named for f in _local_files(p)]
    return filesystem, [f for p in named for f in _remote_files(filesystem, p)]


def resolve_paths(paths: Any, filesystem: Any = None) -> tuple[Any, list[str]]:
    """(the filesystem, each path or URL the user named as a path on it), listing nothing."""
    import pyarrow.fs as pafs

    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    texts = [os.fspath(item) for item in items]
    schemes = {t.split("://", 1)[0] if "://" in t else "file" for t in texts}
    if len(schemes) > 1:
        raise YogaError(f"Parquet paths must all be on one filesystem, got {sorted(schemes)}")
    scheme = schemes.pop() if schemes else "file"
    if scheme not in ("file", "s3", "gs"):
        raise YogaError(f"{texts[0]}: Parquet URLs may be file://, s3:// or gs://")
    if scheme == "file" and filesystem is None:
        return pafs.LocalFileSystem(), [os.path.abspath(t.removeprefix("file://")) for t in texts]
    if filesystem is None:
        try:
            filesystem, _ = pafs.FileSystem.from_uri(texts[0])
        except Exception as exc:
            raise YogaError(
                f"{texts[0]}: cannot open its filesystem ({exc}); pass filesystem= (a pyarrow.fs "
                "filesystem with your endpoint and credentials)"
            ) from exc
    return filesystem, [t.split("://", 1)[1] if "://" in t else t for t in texts]


def _local_files(text: str) -> list[str]:
    if any(ch in text for ch in "*?["):
        matched = sorted(globlib.glob(text, recursive=True))
        if not matched:
            raise YogaError(f"Parquet glob {text!r} matches no file")
        return matched
    if os.path.isdir(text):
        found = sorted(
            os.path.join(d, f) for d, _, names in os.walk(text) for f in names if _is_parquet(f)
        )
        if not found:
            raise YogaError(f"Parquet directory {text!r} holds no *.parquet file")
        return found
    if os.path.exists(text):
        return [text]
    raise YogaError(f"Parquet path {text!r} does not exist")


def _remote_files(filesystem: Any, path: str) -> list[str]:
    """Files of a bucket path: a file, a "directory" (recursively) or a glob in its last part."""
    import pyarrow.fs as pafs

    where = f"{filesystem.type_name}://{path}"
    try:
        if any(ch in path for ch in "*?["):
            if "/" not in path or any(ch in path.rsplit("/", 1)[0] for ch in "*?["):
                raise YogaError(
                    f"{where}: in a bucket URL only the last part may be a glob "
                    "(s3://bucket/folder/part-*.parquet)"
                )
            parent, pattern = path.rsplit("/", 1)
            infos = filesystem.get_file_info(pafs.FileSelector(parent))
            found = sorted(
                i.path for i in infos if i.is_file and fnmatch.fnmatch(i.base_name, pattern)
            )
            if not found:
                raise YogaError(f"Parquet glob {where!r} matches no file")
            return found
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [path]
        if info.type == pafs.FileType.Directory:
            infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
            found = sorted(i.path for i in infos if i.is_file and _is_parquet(i.base_name))
            if not found:
                raise YogaError(f"Parquet directory {where!r} holds no *.parquet file")
            return found
    except OSError as exc:
        raise YogaError(
            f"{where}: cannot list it ({exc}): check the bucket, credentials and endpoint"
        ) from exc
    raise YogaError(f"Parquet path {where!r} does not exist")


def _is_parquet(name: str) -> bool:
    return name.endswith(".parquet") or name.endswith(".parq")
