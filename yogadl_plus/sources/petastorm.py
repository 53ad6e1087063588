"""Petastorm datasets: Parquet stores whose ``_common_metadata`` holds a pickled Unischema, and
whose binary columns hold tensors in Petastorm's codecs.

The Unischema is read with a restricted unpickler: it knows the few Petastorm, numpy, pyspark
and standard-library names a Unischema is made of and builds plain stand-ins of them; any other
name is refused before anything is called, so a hostile store cannot run code. Petastorm itself
is not needed. Values are decoded with numpy (``allow_pickle=False``) and Pillow.

Spark's ``partitionBy`` folders (``station=north/``) are read as the partition columns of
ParquetSource, with the types of the Unischema's fields of the same names.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from yogadl_plus import codecs
from yogadl_plus.errors import SchemaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.parquet import (
    NULL_PARTITION,
    ParquetSource,
    arrow_to_schema,
    column_values,
    resolve_paths,
)

__all__ = ["UNISCHEMA_KEY", "PetastormSource", "load_unischema", "parquet_source"]

UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"


# --------------------------------------------------------------------------- stand-ins


class _Unischema:
    """Petastorm's Unischema: a name and an ordered dict of fields (set by the pickle)."""

    _name: str
    _fields: dict[str, Any]


class _UnischemaField(NamedTuple):
    name: str
    numpy_dtype: Any
    shape: tuple[int | None, ...]
    codec: Any = None
    nullable: bool = False


class _Codec:
    """A Petastorm codec: only its class and attributes matter here."""


class _ScalarCodec(_Codec):
    pass


class _NdarrayCodec(_Codec):
    pass


class _CompressedNdarrayCodec(_Codec):
    pass


class _CompressedImageCodec(_Codec):
    _image_codec: str = ".png"
    _quality: int = 80


class _SparkType:
    """A pyspark.sql.types type: the numpy dtype of the field says what we need."""


_SPARK_TYPES = (
    *("BinaryType", "BooleanType", "ByteType", "DateType", "DecimalType", "DoubleType"),
    *("FloatType", "IntegerType", "LongType", "NullType", "ShortType", "StringType"),
    *("TimestampType", "TimestampNTZType", "ArrayType"),
)


class _Dtype:
    """``numpy.dtype(spec)`` as a pickle rebuilds it (then BUILD with its byte order)."""

    def __init__(self, spec: str, align: bool = False, copy: bool = False) -> None:
        self.dtype = np.dtype(spec)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        if len(state) > 1 and state[1] in ("<", ">"):
            self.dtype = self.dtype.newbyteorder(state[1])


def _reconstructor(cls: type, base: type, state: Any) -> Any:
    """copyreg._reconstructor of protocol-0/1 pickles, for our stand-ins only: a plain object,
    or a UnischemaField (a namedtuple) from its values."""
    if cls is _UnischemaField and base is tuple and isinstance(state, tuple):
        return _UnischemaField(*state)
    if cls not in _STAND_INS or base is not object or state is not None:
        raise SchemaError(f"refusing to rebuild {cls!r} from {base!r} in a Petastorm schema")
    return object.__new__(cls)


_STAND_INS: tuple[type, ...] = (
    _Unischema,
    _ScalarCodec,
    _NdarrayCodec,
    _CompressedNdarrayCodec,
    _CompressedImageCodec,
)
_NUMPY_TYPES = (
    *("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"),
    *("float16", "float32", "float64", "str_", "unicode_", "bytes_", "string_", "datetime64"),
)

_ALLOWED: dict[tuple[str, str], Any] = {
    ("petastorm.unischema", "Unischema"): _Unischema,
    ("petastorm.unischema", "UnischemaField"): _UnischemaField,
    ("petastorm.codecs", "ScalarCodec"): _ScalarCodec,
    ("petastorm.codecs", "NdarrayCodec"): _NdarrayCodec,
    ("petastorm.codecs", "CompressedNdarrayCodec"): _CompressedNdarrayCodec,
    ("petastorm.codecs", "CompressedImageCodec"): _CompressedImageCodec,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("numpy", "dtype"): _Dtype,
    **{(m, "_reconstructor"): _reconstructor for m in ("copyreg", "copy_reg")},
    **{(m, "object"): object for m in ("builtins", "__builtin__")},
    **{
        (m, t.__name__): t
        for m in ("builtins", "__builtin__")
        for t in (str, bytes, int, float, bool, tuple)
    },
    **{("pyspark.sql.types", t): type(t, (_SparkType,), {}) for t in _SPARK_TYPES},
    **{("numpy", t): getattr(np, t) for t in _NUMPY_TYPES if hasattr(np, t)},
}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(io.BytesIO(data))
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise SchemaError(
                f"{self.where}: refusing to unpickle {module}.{name} from the Petastorm schema: "
                "only Petastorm, numpy and pyspark type names may appear there (a store from "
                "an untrusted source?)"
            ) from None


def load_unischema(data: bytes, where: str) -> list[_UnischemaField]:
    """The fields of a pickled Unischema, in order, read without running any code."""
    try:
        found = _RestrictedUnpickler(data, where).load()
    except SchemaError:
        raise
    except Exception as exc:
        raise SchemaError(f"{where}: cannot read the Petastorm schema ({exc!r})") from exc
    fields = getattr(found, "_fields", None)
    if not isinstance(found, _Unischema) or not isinstance(fields, dict):
        raise SchemaError(f"{where}: the Petastorm schema is not a Unischema: {found!r}")
    if not all(isinstance(f, _UnischemaField) for f in fields.values()):
        raise SchemaError(f"{where}: the Petastorm schema has fields that are not UnischemaFields")
    return list(fields.values())


# --------------------------------------------------------------------------- our schema


def _dtype(field: _UnischemaField, where: str) -> Any:
    kind = field.numpy_dtype
    if isinstance(kind, _Dtype):
        kind = kind.dtype
    if kind in (str, np.str_) or getattr(kind, "kind", "") == "U":
        return str
    if kind in (bytes, np.bytes_) or getattr(kind, "kind", "") == "S":
        return bytes
    try:
        return np.dtype(kind)
    except TypeError:
        raise SchemaError(
            f"{where}: field {field.name!r} has numpy_dtype {kind!r}, which yogadl_plus does not "
            "store; leave it out with columns="
        ) from None


def our_field(field: _UnischemaField, where: str) -> tuple[Field, str]:
    """Our Field for a Unischema field, and how its Parquet values decode ('' when plain)."""
    kind = _dtype(field, where)
    shape = tuple(field.shape or ())
    codec = field.codec
    if codec is None or isinstance(codec, _ScalarCodec):
        return Field(field.name, kind, shape, nullable=field.nullable), ""
    if isinstance(codec, _NdarrayCodec):
        return Field(field.name, kind, shape, codecs.Raw(), field.nullable), "npy"
    if isinstance(codec, _CompressedNdarrayCodec):
        return Field(field.name, kind, shape, codecs.Compressed(), field.nullable), "npz"
    if isinstance(codec, _CompressedImageCodec):
        # PNG stays PNG (lossless); JPEG pixels are kept as decoded, not compressed twice.
        if codec._image_codec.lstrip(".").lower() == "png":
            try:
                return Field(field.name, kind, shape, codecs.Image("png"), field.nullable), "image"
            except SchemaError:
                pass  # a shape or dtype PNG does not store: keep the pixels raw
        return Field(field.name, kind, shape, codecs.Raw(), field.nullable), "image"
    raise SchemaError(f"{where}: field {field.name!r} has an unknown codec {codec!r}")


class _PetastormColumns:
    """Turns Arrow columns of a Petastorm store into record values (picklable: parts of a
    parallel build carry it)."""

    def __init__(self, decoders: dict[str, str]) -> None:
        self.decoders = decoders

    def __call__(self, column: Any, field: Field) -> Sequence[Any]:
        how = self.decoders.get(field.name, "")
        if not how:
            return column_values(column, field)
        decode = _DECODERS[how]
        return [None if raw is None else decode(raw, field) for raw in column.to_pylist()]


def _npy(raw: bytes, field: Field) -> np.ndarray:
    return np.load(io.BytesIO(raw), allow_pickle=False)


def _npz(raw: bytes, field: Field) -> np.ndarray:
    with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
        return archive[archive.files[0]]  # Petastorm names it 'arr'


def _image(raw: bytes, field: Field) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(raw)) as image:
        return np.asarray(image, dtype=field.dtype)


_DECODERS: dict[str, Callable[[bytes, Field], np.ndarray]] = {
    "npy": _npy,
    "npz": _npz,
    "image": _image,
}


class PetastormSource(ParquetSource):
    """A Petastorm dataset (a folder or URL with ``_common_metadata``), cached as decoded
    tensors under our own schema: NdarrayCodec and CompressedNdarrayCodec fields become numeric
    fields (``codecs.Raw`` / ``codecs.Compressed``), PNG images ``codecs.Image("png")``, JPEG
    images their decoded pixels, scalars plain fields; Unischema shapes, dtypes and
    nullability carry over. ``columns``, ``filesystem`` and ``partitioning`` as for
    ParquetSource: partition folders (Spark's ``partitionBy``) become the Unischema's fields of
    those names, with their types, or fields of their own after the Unischema's."""

    kind = "petastorm"

    def __init__(
        self,
        url: str | os.PathLike[str],
        columns: Sequence[str] | None = None,
        filesystem: Any = None,
        partitioning: str | Mapping[str, Any] | None = "hive",
    ) -> None:
        self._where = where = os.fspath(url)
        filesystem, named = resolve_paths(url, filesystem)
        unischema = _read_unischema(filesystem, named[0])
        if unischema is None:
            raise SchemaError(
                f"{where}: no Petastorm schema (no _common_metadata with "
                f"{UNISCHEMA_KEY.decode()}): read it as plain Parquet with ParquetSource"
            )
        self._unischema = {f.name: f for f in load_unischema(unischema, where)}
        super().__init__(url, columns=columns, filesystem=filesystem, partitioning=partitioning)
        import pyarrow as pa

        # Partition columns the Unischema does not list are data too: fields of their own.
        extra = [f for f in self.partitions.fields if f.name not in self._unischema]
        own = {f.name: f for f in arrow_to_schema(pa.schema(extra))} if extra else {}
        names = self.columns if self.columns is not None else [*self._unischema, *own]
        missing = [n for n in names if n not in self._unischema and n not in own]
        if missing:
            raise SchemaError(
                f"{where}: columns {missing} are not in the Petastorm schema "
                f"{[*self._unischema, *own]}"
            )
        made = [(own[n], "") if n in own else our_field(self._unischema[n], where) for n in names]
        self._petastorm_schema = Schema([f for f, _ in made])
        self.values = _PetastormColumns({f.name: how for f, how in made if how})

    def _partition_type(self, name: str, texts: Sequence[str | None]) -> Any:
        """The type of the Unischema's field ``name``: a partition folder holds a scalar."""
        field = self._unischema.get(name)
        if field is None:
            return super()._partition_type(name, texts)
        ours, how = our_field(field, self._where)
        if how or ours.shape:
            raise SchemaError(
                f"{self._where}: partition column {name!r} is {ours.describe()} in the "
                "Petastorm schema, but a partition folder holds one scalar value"
            )
        if None in texts and not ours.nullable:
            raise SchemaError(
                f"{self._where}: partition column {name!r} has a null partition "
                f"({name}={NULL_PARTITION}), but the Petastorm schema says it is not nullable"
            )
        import pyarrow as pa

        if ours.kind == "str":
            return pa.string()
        if ours.kind == "bytes":
            return pa.binary()
        return pa.from_numpy_dtype(ours.dtype)

    @property
    def schema(self) -> Schema:
        return self._petastorm_schema


def parquet_source(paths: Any) -> ParquetSource:
    """A PetastormSource when ``paths`` is one folder or URL holding a Petastorm dataset, else a
    ParquetSource."""
    if isinstance(paths, (str, os.PathLike)):
        filesystem, (folder,) = resolve_paths(paths)
        if _read_unischema(filesystem, folder) is not None:
            return PetastormSource(paths, filesystem=filesystem)
    return ParquetSource(paths)


def _read_unischema(filesystem: Any, folder: str) -> bytes | None:
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    path = folder.rstrip("/") + "/_common_metadata"
    try:
        if filesystem.get_file_info(path).type != pafs.FileType.File:
            return None
        with filesystem.open_input_file(path) as f:
            metadata = pq.read_metadata(f).metadata or {}
    except (OSError, ValueError):
        return None
    return metadata.get(UNISCHEMA_KEY)
