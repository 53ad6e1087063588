"""Petastorm datasets: Parquet stores whose ``_common_metadata`` holds a pickled Unischema, and
whose binary columns hold tensors in Petastorm's codecs.

The Unischema is read with a restricted unpickler: it knows the few Petastorm, numpy, pyspark
and standard-library names a Unischema is made of and builds plain stand-ins of them; any other
name is refused before anything is called, so a hostile store cannot run code. Types a Unischema
only names (``numpy.int64`` as a field's dtype, ``tuple`` as a reconstructor's base) come back as
names that cannot be called, so a pickle cannot make them build anything (``bytes(10**9)``);
what may be called builds only small things: empty stand-ins keeping the attributes read here,
a field from its five values, an empty OrderedDict, a plain ``numpy.dtype``. Petastorm itself is
not needed. Values are decoded with numpy (``allow_pickle=False``) and Pillow.

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
from yogadl_plus.errors import RefusedCall, SchemaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.arrow import arrow_to_schema, column_values
from yogadl_plus.sources.locations import resolve_paths
from yogadl_plus.sources.parquet import NULL_PARTITION, ParquetSource

__all__ = ["UNISCHEMA_KEY", "PetastormSource", "load_unischema", "parquet_source"]

UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"


# --------------------------------------------------------------------------- stand-ins


class _StandIn:
    """An object a pickle builds from nothing, then gives its attributes (BUILD). Only the
    attributes read here are kept, so that a state handed to many objects is never copied."""

    #: The attributes kept from a pickled state (others, such as a Unischema's attribute per
    #: field, are not needed).
    _KEPT: tuple[str, ...] = ()

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and state[1] is None:
            state = state[0]  # (dict state, no slot state), as protocol 2+ may write it
        if not isinstance(state, dict):
            raise RefusedCall(f"{type(self).__name__}.__setstate__(...)", "a state is a dict")
        for name in self._KEPT:
            if name in state:
                setattr(self, name, state[name])


class _Unischema(_StandIn):
    """Petastorm's Unischema: a name and an ordered dict of fields (set by the pickle)."""

    _KEPT = ("_name", "_fields")
    _name: str
    _fields: dict[str, Any]


class _UnischemaField(NamedTuple):
    name: str
    numpy_dtype: Any
    shape: tuple[int | None, ...]
    codec: Any = None
    nullable: bool = False


class _Codec(_StandIn):
    """A Petastorm codec: only its class and attributes matter here."""


class _ScalarCodec(_Codec):
    pass


class _NdarrayCodec(_Codec):
    pass


class _CompressedNdarrayCodec(_Codec):
    pass


class _CompressedImageCodec(_Codec):
    _KEPT = ("_image_codec", "_quality")
    _image_codec: str = ".png"
    _quality: int = 80


class _SparkType(_StandIn):
    """A pyspark.sql.types type: the numpy dtype of the field says what we need."""


_SPARK_TYPES = (
    *("BinaryType", "BooleanType", "ByteType", "DateType", "DecimalType", "DoubleType"),
    *("FloatType", "IntegerType", "LongType", "NullType", "ShortType", "StringType"),
    *("TimestampType", "TimestampNTZType", "ArrayType"),
)


def _ordered_dict(*args: Any, **kwargs: Any) -> collections.OrderedDict[Any, Any]:
    """``collections.OrderedDict()`` as its pickles call it: empty (the items follow), so
    that no other container of the pickle can be copied into one."""
    if args or kwargs:
        raise RefusedCall("collections.OrderedDict(...)", "an OrderedDict is pickled empty")
    return collections.OrderedDict()


class _Dtype:
    """``numpy.dtype(spec)`` as a pickle rebuilds it (then BUILD with its byte order): a plain
    dtype only, from a short spec (no fields, no shape inside, no Python objects)."""

    def __init__(self, spec: str, align: bool = False, copy: bool = False) -> None:
        if not isinstance(spec, str) or len(spec) > _DTYPE_SPEC_CHARS:
            raise RefusedCall(f"numpy.dtype({spec!r:.40})", "a dtype is named by a short string")
        try:
            dtype = np.dtype(spec)
        except (TypeError, ValueError):
            raise RefusedCall(f"numpy.dtype({spec!r})", "numpy does not know it") from None
        if dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in "biufcmMSU":
            raise RefusedCall(f"numpy.dtype({spec!r})", "a field's dtype is one plain type")
        self.dtype = dtype

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        if len(state) > 1 and state[1] in ("<", ">"):
            self.dtype = self.dtype.newbyteorder(state[1])


class _Name:
    """A type a Unischema only names, never calls: ``numpy.int64`` as a field's dtype,
    ``tuple`` as the base of a reconstructed namedtuple. Calling it is refused, so a pickle
    cannot make it build anything."""

    __slots__ = ("name", "type")

    def __init__(self, name: str, kind: type) -> None:
        self.name, self.type = name, kind

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        shown = ", ".join([*(f"{a!r:.40}" for a in args), *(f"{k}=..." for k in kwargs)])
        raise RefusedCall(f"{self.name}({shown})", "a Unischema only names this type")

    def __repr__(self) -> str:
        return self.name


def _reconstructor(cls: type, base: Any, state: Any) -> Any:
    """copyreg._reconstructor of protocol-0/1 pickles, for our stand-ins only: a plain object,
    or a UnischemaField (a namedtuple) from its values."""
    if cls is _UnischemaField and base is _TUPLE and isinstance(state, tuple) and len(state) <= 5:
        return _UnischemaField(*state)
    if cls not in _STAND_INS or base is not _OBJECT or state is not None:
        raise RefusedCall(f"copyreg._reconstructor({cls!r}, {base!r}, ...)", "not a stand-in")
    return object.__new__(cls)


_STAND_INS: tuple[type, ...] = (
    _Unischema,
    _ScalarCodec,
    _NdarrayCodec,
    _CompressedNdarrayCodec,
    _CompressedImageCodec,
)
_DTYPE_SPEC_CHARS = 16
_NUMPY_TYPES = {
    **{t: getattr(np, t) for t in ("bool_", "int8", "int16", "int32", "int64", "uint8")},
    **{t: getattr(np, t) for t in ("uint16", "uint32", "uint64", "float16", "float32")},
    **{t: getattr(np, t) for t in ("float64", "str_", "bytes_", "datetime64")},
    "unicode_": np.str_,  # the numpy 1 names of str_ and bytes_, in old pickles
    "string_": np.bytes_,
}
_BUILTIN_TYPES = {t.__name__: t for t in (str, bytes, int, float, bool, tuple, object)}
# One name per type, whichever module spelling the pickle used (builtins or __builtin__).
_NAMES = {
    **{("builtins", n): _Name(f"builtins.{n}", t) for n, t in _BUILTIN_TYPES.items()},
    **{("numpy", n): _Name(f"numpy.{n}", t) for n, t in _NUMPY_TYPES.items()},
}
_TUPLE, _OBJECT = _NAMES[("builtins", "tuple")], _NAMES[("builtins", "object")]

_ALLOWED: dict[tuple[str, str], Any] = {
    ("petastorm.unischema", "Unischema"): _Unischema,
    ("petastorm.unischema", "UnischemaField"): _UnischemaField,
    ("petastorm.codecs", "ScalarCodec"): _ScalarCodec,
    ("petastorm.codecs", "NdarrayCodec"): _NdarrayCodec,
    ("petastorm.codecs", "CompressedNdarrayCodec"): _CompressedNdarrayCodec,
    ("petastorm.codecs", "CompressedImageCodec"): _CompressedImageCodec,
    ("collections", "OrderedDict"): _ordered_dict,
    ("numpy", "dtype"): _Dtype,
    **{(m, "_reconstructor"): _reconstructor for m in ("copyreg", "copy_reg")},
    **_NAMES,
    **{("__builtin__", n): _NAMES[("builtins", n)] for n in _BUILTIN_TYPES},
    **{("pyspark.sql.types", t): type(t, (_SparkType,), {}) for t in _SPARK_TYPES},
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
    except RefusedCall as refused:
        raise SchemaError(
            f"{where}: refusing to call {refused.call} from the Petastorm schema ({refused.why}): "
            "a Unischema is made of Petastorm, numpy and pyspark type names and plain values "
            "(a store from an untrusted source?)"
        ) from None
    except Exception as exc:
        raise SchemaError(f"{where}: cannot read the Petastorm schema ({exc!r:.200})") from exc
    fields = getattr(found, "_fields", None)
    if not isinstance(found, _Unischema) or not isinstance(fields, dict):
        raise SchemaError(f"{where}: the Petastorm schema is not a Unischema: {found!r:.100}")
    for field in fields.values():
        _check_field(field, where)
    return list(fields.values())


def _check_field(field: Any, where: str) -> None:
    """A UnischemaField of plain values: a str name, a tuple shape of sizes or None, a dtype
    the unpickler built or named, a stand-in codec or None, a bool nullable."""
    if not isinstance(field, _UnischemaField) or not isinstance(field.name, str):
        raise SchemaError(f"{where}: the Petastorm schema has a field that is no UnischemaField")
    shape = field.shape
    plain = (
        isinstance(shape, tuple)
        and all(d is None or (type(d) is int and d >= 0) for d in shape)
        and isinstance(field.numpy_dtype, (_Name, _Dtype))
        and hasattr(field.numpy_dtype, "type" if isinstance(field.numpy_dtype, _Name) else "dtype")
        and (field.codec is None or isinstance(field.codec, _Codec))
        and isinstance(getattr(field.codec, "_image_codec", ""), str)
        and isinstance(field.nullable, bool)
    )
    if not plain:
        raise SchemaError(
            f"{where}: field {field.name!r} of the Petastorm schema is malformed: {field!r:.200}"
        )


# --------------------------------------------------------------------------- our schema


def _dtype(field: _UnischemaField, where: str) -> Any:
    kind = field.numpy_dtype
    if isinstance(kind, _Dtype):
        kind = kind.dtype
    elif isinstance(kind, _Name):
        kind = kind.type
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
