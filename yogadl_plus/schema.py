"""The schema is data: named fields with dtype, shape, codec and nullability, stored as JSON.

Every record written to a cache is checked against the schema, field by field, so that a bad
record fails the build with a message naming the record, the field, what was expected and what
came, instead of producing a cache that decodes to garbage later.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import numpy as np

from yogadl_plus import codecs
from yogadl_plus.errors import SchemaError

__all__ = ["Field", "Schema", "infer_schema"]

Shape = tuple[int | None, ...]

_TEXT_NAMES = {"str": "str", "string": "str", "unicode": "str", "bytes": "bytes", "binary": "bytes"}


def _normalize_dtype(dtype: Any) -> tuple[str, np.dtype | None]:
    """('numeric', dtype) for numbers and bools, ('str' | 'bytes', None) for text and binary."""
    if dtype is str or dtype is np.str_:
        return "str", None
    if dtype is bytes or dtype is np.bytes_:
        return "bytes", None
    if isinstance(dtype, str) and dtype.lower() in _TEXT_NAMES:
        return _TEXT_NAMES[dtype.lower()], None
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise SchemaError(f"not a dtype: {dtype!r} ({exc})") from None
    if dt.kind in "biufcmM":
        # Stored bytes are little-endian whatever the writer's machine.
        return "numeric", dt.newbyteorder("<") if dt.byteorder not in "|<" else dt
    if dt.kind == "U":
        return "str", None
    if dt.kind == "S":
        return "bytes", None
    raise SchemaError(
        f"unsupported dtype {dt} (kind {dt.kind!r}): use a numeric or bool dtype, str or bytes"
    )


def _normalize_shape(name: str, shape: Any) -> Shape:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise SchemaError(f"field {name!r}: shape must be a tuple, got {shape!r}") from None
    for d in dims:
        if d is not None and (not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0):
            raise SchemaError(
                f"field {name!r}: shape dims must be ints >= 0 or None, got {shape!r}"
            )
    return tuple(None if d is None else int(d) for d in dims)


@dataclass(frozen=True)
class Field:
    """One named field of every record: ``Field("image", np.uint8, (None, None, 3))``."""

    name: str
    dtype: Any
    shape: Shape = ()
    codec: codecs.Codec | None = None
    nullable: bool = False
    kind: str = dataclass_field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError(f"a field name must be a non-empty str, got {self.name!r}")
        kind, dt = _normalize_dtype(self.dtype)
        set_ = object.__setattr__
        set_(self, "kind", kind)
        set_(self, "dtype", dt if kind == "numeric" else (str if kind == "str" else bytes))
        if kind != "numeric" and self.shape not in ((), None):
            raise SchemaError(f"field {self.name!r}: {kind} fields have shape (), got {self.shape}")
        set_(self, "shape", _normalize_shape(self.name, self.shape) if kind == "numeric" else ())
        if self.codec is None:
            default = {"str": codecs.String(), "bytes": codecs.Bytes()}.get(kind)
            set_(self, "codec", default or (codecs.Scalar() if self.shape == () else codecs.Raw()))
        elif not isinstance(self.codec, codecs.Codec):
            raise SchemaError(
                f"field {self.name!r}: codec must be a yogadl_plus.codecs object, "
                f"got {self.codec!r}"
            )
        set_(self, "nullable", bool(self.nullable))
        self.codec.check(self)  # type: ignore[union-attr]

    # --- what the codecs and the layout ask of a field ---

    @property
    def dtype_name(self) -> str:
        """'str', 'bytes', or the numpy dtype string ('<f4', '|u1', '<M8[ns]')."""
        return self.dtype.str if self.kind == "numeric" else self.kind

    @property
    def num_variable_dims(self) -> int:
        return sum(d is None for d in self.shape)

    @property
    def fixed(self) -> bool:
        """True when every value encodes to exactly ``nbytes`` bytes (bulk-decodable)."""
        return not self.nullable and self.codec.is_fixed_for(self)  # type: ignore[union-attr]

    @property
    def nbytes(self) -> int:
        return int(self.dtype.itemsize * math.prod(self.shape))  # type: ignore[arg-type]

    def require_numeric(self, codec: codecs.Codec) -> None:
        if self.kind != "numeric":
            raise SchemaError(
                f"field {self.name!r}: {codec!r} stores numeric arrays, not {self.kind}"
            )

    def require_kind(self, codec: codecs.Codec, kind: str) -> None:
        if self.kind != kind:
            raise SchemaError(
                f"field {self.name!r}: {codec!r} stores {kind} values, not {self.dtype_name}"
            )

    def describe(self) -> str:
        if self.kind != "numeric":
            return self.kind
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]" if self.shape else self.dtype.name

    # --- JSON ---

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype_name,
            "shape": list(self.shape),
            "codec": self.codec.to_json(),  # type: ignore[union-attr]
            "nullable": self.nullable,
        }

    @classmethod
    def from_json(cls, spec: Mapping[str, Any]) -> Field:
        return cls(
            name=spec["name"],
            dtype=spec["dtype"],
            shape=tuple(spec.get("shape", ())),
            codec=codecs.codec_from_json(spec["codec"]),
            nullable=bool(spec.get("nullable", False)),
        )

    # --- validation ---

    def converter(self) -> Callable[[Any], Any]:
        """A function value -> value in this field's exact type, raising ValueError if it cannot.

        Numbers are converted only when no information is lost: numpy values by numpy's 'safe'
        casting rules (int32 -> int64, float32 -> float64, big-endian -> little-endian), Python
        scalars and lists when converting back gives the same values.
        """
        if self.kind == "str":
            return _convert_text(str, self.name)
        if self.kind == "bytes":
            return _convert_text(bytes, self.name)
        return _numeric_converter(self)


def _convert_text(kind: type, name: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if type(value) is kind:
            return value
        if kind is str and isinstance(value, (str, np.str_)):
            return str(value)
        if kind is bytes and isinstance(value, (bytes, bytearray, memoryview, np.bytes_)):
            return bytes(value)
        if kind is str and isinstance(value, bytes):
            raise ValueError("got bytes; decode it to str first, or declare the field as bytes")
        raise ValueError(f"got {type(value).__name__}")

    return convert


def _holds_none(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(v is None or _holds_none(v) for v in value)
    return False


def _numeric_converter(field: Field) -> Callable[[Any], np.ndarray]:
    dtype: np.dtype = field.dtype
    shape = field.shape
    fixed_shape = None not in shape
    ndim = len(shape)

    def shape_ok(got: tuple[int, ...]) -> bool:
        if fixed_shape:
            return got == shape
        return len(got) == ndim and all(e is None or e == g for e, g in zip(shape, got))

    def convert(value: Any) -> np.ndarray:
        if isinstance(value, (np.ndarray, np.generic)):
            array = np.asarray(value)
            if array.dtype != dtype:
                if not np.can_cast(array.dtype, dtype, "safe"):
                    raise ValueError(
                        f"got dtype {array.dtype} which does not cast to {dtype} without loss; "
                        f"convert it yourself or declare the field as {array.dtype}"
                    )
                array = array.astype(dtype)
        elif isinstance(value, (bool, int, float, complex, list, tuple)):
            try:
                array = np.asarray(value, dtype=dtype)
                same = np.array_equal(array, np.asarray(value), equal_nan=dtype.kind in "fc")
            except (OverflowError, ValueError, TypeError) as exc:
                same, problem = False, f", not convertible to {dtype}: {exc}"
            else:
                problem = f" which is not exactly representable as {dtype}"
            if not same and _holds_none(value):
                raise ValueError(
                    f"got {_describe_value(value)} with a null (None) inside; fill it, or "
                    "leave the record out"
                )
            if not same:
                raise ValueError(f"got {_describe_value(value)}{problem}")
        else:
            raise ValueError(f"got {_describe_value(value)}")
        if not shape_ok(array.shape):
            raise ValueError(f"got shape {array.shape}")
        return array

    return convert


def _describe_value(value: Any) -> str:
    if isinstance(value, (np.ndarray, np.generic)):
        return f"{value.dtype}{list(np.shape(value))}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of length {len(value)}"
    return f"{type(value).__name__} {value!r}"[:80]


class Schema:
    """An ordered collection of uniquely named fields."""

    def __init__(self, fields: Iterable[Field]) -> None:
        self.fields: tuple[Field, ...] = tuple(fields)
        if not self.fields:
            raise SchemaError("a schema needs at least one field")
        seen: set[str] = set()
        for f in self.fields:
            if not isinstance(f, Field):
                raise SchemaError(f"Schema takes Field objects, got {f!r}")
            if f.name in seen:
                raise SchemaError(f"field name {f.name!r} appears twice in the schema")
            seen.add(f.name)
        self._by_name = {f.name: f for f in self.fields}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def __getitem__(self, name: str) -> Field:
        try:
            return self._by_name[name]
        except KeyError:
            raise SchemaError(f"no field {name!r}; the schema has {list(self.names)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.fields == other.fields

    def __hash__(self) -> int:
        return hash(self.fields)

    def __repr__(self) -> str:
        inner = ",\n    ".join(repr(f) for f in self.fields)
        return f"Schema([\n    {inner},\n])"

    def select(self, names: Sequence[str] | None) -> tuple[Field, ...]:
        """The fields named (all when None), in the order given; unknown names are an error."""
        if names is None:
            return self.fields
        if isinstance(names, str):
            names = [names]
        return tuple(self[n] for n in names)

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.fields]

    @classmethod
    def from_json(cls, spec: Sequence[Mapping[str, Any]]) -> Schema:
        return cls(Field.from_json(s) for s in spec)


def _infer_value(name: str, value: Any) -> tuple[str, np.dtype | None, tuple[int, ...]]:
    if isinstance(value, (str, np.str_)):
        return "str", None, ()
    if isinstance(value, (bytes, bytearray, memoryview, np.bytes_)):
        return "bytes", None, ()
    if isinstance(value, bool):
        return "numeric", np.dtype(bool), ()
    if isinstance(value, int):
        return "numeric", np.dtype(np.int64), ()
    if isinstance(value, float):
        return "numeric", np.dtype(np.float64), ()
    if isinstance(value, (np.ndarray, np.generic, list, tuple)):
        array = np.asarray(value)
        if array.dtype.kind in "biufcmM":
            return "numeric", array.dtype, array.shape
        if array.dtype.kind in "US" and array.ndim == 0:
            return ("str" if array.dtype.kind == "U" else "bytes"), None, ()
    raise SchemaError(
        f"field {name!r}: cannot infer a field from {_describe_value(value)}; records hold numpy "
        "arrays or scalars, Python numbers, str or bytes. Pass schema= to cache_dataset."
    )


def infer_schema(records: Sequence[Mapping[str, Any]]) -> Schema:
    """A schema that fits all of ``records`` (the first few of a source).

    Dims that differ between the records become None, a field that is None somewhere becomes
    nullable, and numeric dtypes that differ are promoted only where that is lossless.
    """
    if not records:
        raise SchemaError("cannot infer a schema from a source with no records; pass schema=")
    first = records[0]
    if not isinstance(first, Mapping):
        raise SchemaError(f"record 0: records are dicts of field name -> value, got {type(first)}")
    seen: dict[str, list[tuple[str, np.dtype | None, tuple[int, ...]]]] = {k: [] for k in first}
    nullable = {k: False for k in first}
    for index, record in enumerate(records):
        if not isinstance(record, Mapping) or set(record) != set(first):
            raise SchemaError(
                f"record {index}: fields "
                f"{sorted(record) if isinstance(record, Mapping) else record!r}"
                f" differ from record 0's {sorted(first)}"
            )
        for name, value in record.items():
            if value is None:
                nullable[name] = True
            else:
                seen[name].append(_infer_value(name, value))
    fields = []
    for name, found in seen.items():
        if not found:
            raise SchemaError(f"field {name!r} is None in all first records; pass schema=")
        kinds = {k for k, _, _ in found}
        if len(kinds) > 1:
            raise SchemaError(f"field {name!r} holds different kinds of values: {sorted(kinds)}")
        kind = kinds.pop()
        if kind != "numeric":
            fields.append(Field(name, kind, (), nullable=nullable[name]))
            continue
        dtype = found[0][1]
        for _, other, _ in found[1:]:
            dtype = np.promote_types(dtype, other)  # type: ignore[arg-type]
        shapes = {s for _, _, s in found}
        ranks = {len(s) for s in shapes}
        if len(ranks) > 1:
            raise SchemaError(f"field {name!r} has values of different ranks: {sorted(shapes)}")
        shape = tuple(
            d if len({s[i] for s in shapes}) == 1 else None for i, d in enumerate(found[0][2])
        )
        fields.append(Field(name, dtype, shape, nullable=nullable[name]))
    return Schema(fields)
