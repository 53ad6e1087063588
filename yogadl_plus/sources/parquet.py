"""Parquet files, a directory of them, a glob or a list, local or on S3 / GCS, read with
pyarrow's dataset API and filesystems. Hive partition folders (``id=3/``, as Spark's
``partitionBy`` and pyarrow's ``write_to_dataset`` make them) become columns."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from yogadl_plus.errors import SchemaError, YogaError
from yogadl_plus.schema import Schema
from yogadl_plus.sources.arrow import (
    BATCH_ROWS,
    ColumnValues,
    arrow_field,
    arrow_to_schema,
    batch_columns,
    check_file_types,
    column_values,
    is_list_type,
    refused_cast,
)
from yogadl_plus.sources.base import ColumnBatch, Description, Piece, Source, even_cuts
from yogadl_plus.sources.locations import (
    glob_root,
    has_wildcard,
    list_folder,
    local_matches,
    remote_matches,
    resolve_paths,
    url_of,
)

__all__ = [
    "NULL_PARTITION",
    "ParquetSource",
    "Partitions",
    "infer_partition_type",
]

#: The folder name Hive, Spark and pyarrow write for a null partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# Folders that Spark's, Hive's and pyarrow's readers skip inside a dataset: Spark's _temporary/
# (the files of attempts that failed or are still running) and hidden ones.
_HIDDEN = (".", "_")
_INT_TEXT = re.compile(r"-?(0|[1-9][0-9]*)")


@dataclasses.dataclass(frozen=True)
class Partitions:
    """Hive partition columns: their Arrow fields, in the order the folders nest, and each
    file's values in that order (None for a null: a ``__HIVE_DEFAULT_PARTITION__`` folder).
    No fields for data that is not partitioned."""

    fields: tuple[Any, ...] = ()
    values: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def only(self, paths: Sequence[str]) -> Partitions:
        """These partitions for some of the files (what a piece of a parallel build reads)."""
        if not self.fields:
            return self
        return Partitions(self.fields, {p: self.values[p] for p in paths})

    def expression(self, path: str) -> Any:
        """The partition values of ``path`` as a pyarrow expression: the dataset scanner fills
        the partition columns in from it."""
        import pyarrow as pa
        import pyarrow.compute as pc

        terms = [
            pc.field(f.name).is_null() if v is None else pc.field(f.name) == pa.scalar(v, f.type)
            for f, v in zip(self.fields, self.values[path])
        ]
        return functools.reduce(lambda a, b: a & b, terms)

    def attach(self, table: Any, path: str, rows: int | None = None) -> Any:
        """``table`` (rows of the file ``path``; ``rows`` of them when it has no column) with
        the partition columns appended."""
        import pyarrow as pa

        rows = table.num_rows if rows is None else rows
        values = self.values[path]
        columns = [pa.repeat(pa.scalar(v, f.type), rows) for f, v in zip(self.fields, values)]
        names = [*table.column_names, *self.names]
        return pa.Table.from_arrays([*table.columns, *columns], names=names)


def infer_partition_type(texts: Sequence[str | None]) -> Any:
    """The Arrow type of a partition column whose folders hold ``texts`` (None: a null), as
    pyarrow's hive partitioning infers it: int32 when every value is an integer that fits, else
    a string. Two differences keep every value as it was written: integers beyond int32 are
    int64 (pyarrow makes them strings), and only integers written the way they print count as
    integers (``07`` and ``+7`` stay strings, so that no digit is dropped)."""
    import pyarrow as pa

    present = [t for t in texts if t is not None]
    if not present or not all(_INT_TEXT.fullmatch(t) for t in present):
        return pa.string()
    low, high = min(map(int, present)), max(map(int, present))
    if low >= -(2**31) and high < 2**31:
        return pa.int32()
    return pa.int64() if low >= -(2**63) and high < 2**63 else pa.string()


def _discover_partitions(
    files: Sequence[tuple[str, str | None]],
    types: Mapping[str, Any],
    default_type: Callable[[str, Sequence[str | None]], Any],
) -> Partitions:
    """The Hive partition columns of ``files`` ((path, the folder the user named, or None for
    a file named directly)): ``key=value`` folders below that folder. ``types`` gives some
    columns their Arrow types (or type names); ``default_type(name, texts)`` the others."""
    import pyarrow as pa

    folders = {path: _hive_folders(path, base) for path, base in files}
    keys: list[str] | None = None
    first = ""
    for path, pairs in folders.items():
        names = [name for name, _ in pairs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise SchemaError(f"{path}: partition column {twice[0]!r} has two folders in its path")
        if keys is None:
            keys, first = names, path
        elif names != keys:
            raise SchemaError(
                f"{path} is in the partition folders {names or 'none'}, {first} in {keys}: every "
                "file of a Hive-partitioned dataset sits under folders of the same columns in "
                "the same order; pass partitioning=None to read the files without them"
            )
    unknown = sorted(set(types) - set(keys or ()))
    if unknown:
        raise ValueError(
            f"partitioning= names {unknown}, which are not partition folders of this data "
            f"(it has {keys or 'none'})"
        )
    if not keys:
        return Partitions()
    fields, columns = [], []
    for i, key in enumerate(keys):
        texts = [pairs[i][1] for pairs in folders.values()]
        arrow_type = _arrow_type(key, types[key]) if key in types else default_type(key, texts)
        arrow_field(key, arrow_type, False)  # a type we store, or a SchemaError naming it
        columns.append(_partition_values(key, texts, arrow_type))
        fields.append(pa.field(key, arrow_type, nullable=None in texts))
    values = {path: tuple(column[j] for column in columns) for j, path in enumerate(folders)}
    return Partitions(tuple(fields), values)


def _arrow_type(name: str, spec: Any) -> Any:
    import pyarrow as pa

    if isinstance(spec, pa.DataType):
        return spec
    try:
        return pa.type_for_alias(str(spec))
    except ValueError:
        raise ValueError(
            f"partitioning={{{name!r}: {spec!r}}}: not a pyarrow type or type name "
            "('int32', 'int64', 'string', 'date32', ...)"
        ) from None


def _partition_values(name: str, texts: Sequence[str | None], arrow_type: Any) -> list[Any]:
    """The folder texts of a partition column as values of ``arrow_type`` (None stays None)."""
    import pyarrow as pa

    distinct = sorted({t for t in texts if t is not None})
    try:
        parsed = pa.array(distinct, pa.string()).cast(arrow_type).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        bad = next(t for t in distinct if not _casts(t, arrow_type))
        raise SchemaError(
            f"partition column {name!r}: the folder {name}={bad} is not a {arrow_type} ({exc}); "
            f"give its type with partitioning={{{name!r}: ...}}"
        ) from None
    by_text = dict(zip(distinct, parsed))
    return [None if t is None else by_text[t] for t in texts]


def _casts(text: str, arrow_type: Any) -> bool:
    import pyarrow as pa

    try:
        pa.array([text], pa.string()).cast(arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _hive_folders(path: str, base: str | None) -> list[tuple[str, str | None]]:
    """The ``key=value`` folders between the folder ``base`` and the file ``path``, outermost
    first, URL-decoded as Spark and pyarrow write them (value None for a null partition); none
    for a file named directly (``base`` None)."""
    if base is None or not path.startswith(base):
        return []
    found: list[tuple[str, str | None]] = []
    for part in path[len(base) :].strip("/").split("/")[:-1]:
        if "=" in part:  # other folders are no partition: pyarrow and Spark read through them
            key, _, value = part.partition("=")
            text = None if value == NULL_PARTITION else urllib.parse.unquote(value)
            found.append((urllib.parse.unquote(key), text))
    return found


class ParquetSource(Source):
    """Parquet data: a file, a directory, a glob, a ``file://``, ``s3://`` or ``gs://`` URL, or
    a list of those (all on one filesystem).

    ``columns`` caches only those columns, in that order (partition columns too).
    ``filesystem`` (a ``pyarrow.fs`` filesystem) reads bucket paths through it, for endpoints
    and credentials of your own; without it, ``s3://`` and ``gs://`` URLs use pyarrow's
    standard credential chains.

    Hive partition folders (``key=value``) below a named folder, or below the fixed part of a
    glob, become columns after the files' own: ``partitioning="hive"`` (the default) infers
    their types (see ``infer_partition_type``), a mapping such as ``{"id": "int64"}`` gives
    some of them their types, ``None`` reads the files without them. Files are read in the
    order of their sorted paths, so partition folders in the order of their names.
    """

    kind = "parquet"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        columns: Sequence[str] | None = None,
        filesystem: Any = None,
        partitioning: str | Mapping[str, Any] | None = "hive",
    ) -> None:
        if not (partitioning in ("hive", None) or isinstance(partitioning, Mapping)):
            raise ValueError(
                f"partitioning={partitioning!r}: pass 'hive', None, or a mapping of partition "
                "column -> pyarrow type"
            )
        self.filesystem, found = _expand(paths, filesystem)
        self.paths = [path for path, _ in found]
        self.columns = list(columns) if columns is not None else None
        #: Arrow column -> record values of a field (a subclass decodes its own encodings).
        self.values: ColumnValues = column_values
        #: The Hive partition columns and each file's values.
        self.partitions = Partitions()
        if partitioning is not None:
            types = partitioning if isinstance(partitioning, Mapping) else {}
            self.partitions = _discover_partitions(found, types, self._partition_type)
        self._dataset = self._open_dataset(paths)
        if self.columns is not None:
            missing = [c for c in self.columns if c not in self._dataset.schema.names]
            if missing:
                raise SchemaError(
                    f"columns {missing} are not in the Parquet data; "
                    f"it has {self._dataset.schema.names}"
                )

    def _partition_type(self, name: str, texts: Sequence[str | None]) -> Any:
        """The Arrow type of partition column ``name`` whose folders hold ``texts`` when
        ``partitioning=`` does not say (a subclass may know better)."""
        return infer_partition_type(texts)

    def _open_dataset(self, named: Any) -> Any:
        """The files as one pyarrow dataset: their columns, then the partition columns."""
        import pyarrow as pa
        import pyarrow.dataset as pads

        try:
            files = pads.dataset(self.paths, format="parquet", filesystem=self.filesystem)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise YogaError(f"cannot read the Parquet data {named!r}: {exc}") from exc
        if not self.partitions.fields:
            return files
        both = [n for n in self.partitions.names if n in files.schema.names]
        if both:
            raise SchemaError(
                f"{both[0]!r} is both a column of the Parquet files and a partition folder "
                f"({both[0]}=...): pass partitioning=None to read the files' own column"
            )
        return pads.FileSystemDataset.from_paths(
            self.paths,
            schema=pa.schema([*files.schema, *self.partitions.fields]),
            format=files.format,
            filesystem=self.filesystem,
            partitions=[self.partitions.expression(p) for p in self.paths],
        )

    @property
    def arrow_schema(self) -> Any:
        schema = self._dataset.schema
        if self.columns is not None:
            import pyarrow as pa

            schema = pa.schema([schema.field(c) for c in self.columns])
        return schema

    def _columns_with_nulls(self) -> set[str] | None:
        """Columns that hold nulls, from row-group statistics and partition folders; None if
        some statistics are absent.

        For list columns the leaf statistics also count empty lists, so a list column whose
        statistics report nulls has its top-level validity checked for real.
        """
        names = set(self.arrow_schema.names)
        reported = {f.name for f in self.partitions.fields if f.nullable and f.name in names}
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
                        return None  # the Arrow schema's nullability (partitions': exact)
                    if stats.null_count:
                        reported.add(name)
        nested = {n for n in reported if is_list_type(self.arrow_schema.field(n).type)}
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

    def description(self) -> Description:
        """Nothing: its length and null counts are in the files' footers, which are read only
        for a build, and its fingerprint tells a change at the cost of listing the files."""
        return Description()

    def fingerprint(self) -> str:
        """Paths (partition folders included), sizes and mtimes of the files, the columns
        chosen, and the partition columns with their types."""
        digest = hashlib.sha256()
        for info in self.filesystem.get_file_info(self.paths):
            mtime = info.mtime_ns if info.mtime_ns is not None else ""
            name = info.path  # local paths as before, so existing fingerprints still match
            if self.filesystem.type_name != "local":
                name = f"{self.filesystem.type_name}://{name}"
            digest.update(f"{name}\0{info.size}\0{mtime}\n".encode())
        if self.columns is not None:
            digest.update(("columns:" + ",".join(self.columns)).encode())
        if self.partitions.fields:  # a cache built without them, or as other types, differs
            typed = ",".join(f"{f.name}:{f.type}" for f in self.partitions.fields)
            digest.update(f"partitions:{typed}".encode())
        return "parquet-sha256:" + digest.hexdigest()[:32]

    def _check_files(self) -> list[str]:
        """A SchemaError naming a file whose column has another type than the dataset's (the
        first file's), before any is read; the casts that a value out of range would fail, each
        with its file."""
        return [
            f"{path}: {cast}"
            for path, meta in zip(self.paths, self._footers)
            for cast in check_file_types(path, meta.schema.to_arrow_schema(), self.arrow_schema)
        ]

    def column_batches(self) -> Iterator[ColumnBatch]:
        import pyarrow as pa

        casts = self._check_files()
        scanner = self._dataset.scanner(columns=list(self.schema.names), batch_size=BATCH_ROWS)
        try:
            for batch in scanner.to_batches():
                yield batch_columns(batch, self.schema, self.values)
        except pa.ArrowInvalid as exc:
            raise refused_cast(f"the Parquet files {self.paths[:3]}", casts, exc) from None

    def split(self, parts: int) -> list[Source]:
        """Runs of whole row groups, balanced by rows (a row group is never cut)."""
        self._check_files()
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
                    self.partitions.only(list(selection)),
                )
            )
            offset += rows
        return pieces


class _ParquetPiece(Piece):
    """Some row groups of some files of a ParquetSource, read with its schema: each file's
    columns are cast to the dataset's types, as the dataset scanner of a serial build does,
    and its partition values appended as the scanner appends them."""

    kind = "parquet"

    def __init__(
        self,
        filesystem: Any,
        selection: dict[str, list[int]],
        schema: Schema,
        arrow_schema: Any,
        offset: int,
        rows: int,
        values: ColumnValues,
        kind: str,
        partitions: Partitions,
    ) -> None:
        super().__init__(schema, offset, rows)
        self.filesystem = filesystem
        self.selection = selection
        self.arrow_schema = arrow_schema
        self.values = values
        self.kind = kind
        self.partitions = partitions

    def __repr__(self) -> str:
        return f"<Parquet rows {self.start}..{self.start + self.rows} of {list(self.selection)}>"

    def column_batches(self) -> Iterator[ColumnBatch]:
        for path, groups in self.selection.items():
            for table in self._tables(path, groups):
                table = self._as_dataset_types(table, path)
                yield batch_columns(table, self._schema, self.values)

    def _tables(self, path: str, groups: list[int]) -> Iterator[Any]:
        """The rows of some row groups of one file, its partition columns included."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        own = [n for n in self._schema.names if n not in self.partitions.names]
        with self.filesystem.open_input_file(path) as f:
            parquet = pq.ParquetFile(f)
            if not own:  # partition columns only: the rows are counted, not read
                for g in groups:
                    rows = parquet.metadata.row_group(g).num_rows
                    for start in range(0, rows, BATCH_ROWS):
                        empty = pa.table({})
                        yield self._attach(empty, path, min(BATCH_ROWS, rows - start))
                return
            batches = parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=own)
            for batch in batches:
                yield self._attach(pa.Table.from_batches([batch]), path)

    def _attach(self, table: Any, path: str, rows: int | None = None) -> Any:
        return self.partitions.attach(table, path, rows) if self.partitions.fields else table

    def _as_dataset_types(self, table: Any, path: str) -> Any:
        import pyarrow as pa

        table = table.select(self.arrow_schema.names)
        if table.schema.equals(self.arrow_schema):
            return table
        try:
            return table.cast(self.arrow_schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            casts = check_file_types(path, table.schema, self.arrow_schema)
            raise refused_cast(path, casts, exc) from None


def _expand(paths: Any, filesystem: Any) -> tuple[Any, list[tuple[str, str | None]]]:
    """(the filesystem, the sorted Parquet files on it), each file with the folder below which
    its partition folders are read (None for a file named directly)."""
    filesystem, named = resolve_paths(paths, filesystem)
    if filesystem.type_name == "local":
        return filesystem, [f for p in named for f in _local_files(p)]
    return filesystem, [f for p in named for f in _remote_files(filesystem, p)]


def _local_files(text: str) -> list[tuple[str, str | None]]:
    if has_wildcard(text):
        root = os.path.abspath(glob_root(text))
        return [(f, root) for f in local_matches(text, "Parquet")]
    if os.path.isdir(text):
        root = os.path.abspath(text)
        found = []
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = [d for d in subfolders if not d.startswith(_HIDDEN)]
            found += [os.path.join(folder, f) for f in names if _is_parquet(f)]
        if not found:
            raise YogaError(f"Parquet directory {text!r} holds no *.parquet file")
        return [(f, root) for f in sorted(found)]
    if os.path.exists(text):
        return [(os.path.abspath(text), None)]
    raise YogaError(f"Parquet path {text!r} does not exist")


def _remote_files(filesystem: Any, path: str) -> list[tuple[str, str | None]]:
    """Files of a bucket path: a file, a "directory" (recursively) or a glob in its last part."""
    import pyarrow.fs as pafs

    where = url_of(filesystem, path)
    if has_wildcard(path):
        parent = path.rsplit("/", 1)[0]
        return [(i.path, parent) for i in remote_matches(filesystem, path, "Parquet")]
    try:
        info = filesystem.get_file_info(path)
    except OSError as exc:
        raise YogaError(
            f"{where}: cannot list it ({exc}): check the bucket, credentials and endpoint"
        ) from exc
    if info.type == pafs.FileType.File:
        return [(path, None)]
    if info.type == pafs.FileType.Directory:
        root = path.rstrip("/")
        infos = list_folder(filesystem, pafs.FileSelector(root, recursive=True))
        found = sorted(
            i.path
            for i in infos
            if i.is_file and _is_parquet(i.base_name) and not _hidden_below(root, i.path)
        )
        if not found:
            raise YogaError(f"Parquet directory {where!r} holds no *.parquet file")
        return [(f, root) for f in found]
    raise YogaError(f"Parquet path {where!r} does not exist")


def _hidden_below(root: str, path: str) -> bool:
    """Whether a folder between ``root`` and the file ``path`` is one readers skip."""
    return any(part.startswith(_HIDDEN) for part in path[len(root) :].strip("/").split("/")[:-1])


def _is_parquet(name: str) -> bool:
    return name.endswith(".parquet") or name.endswith(".parq")
