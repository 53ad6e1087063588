"""The schema as data: named fields with dtype, shape, codec and nullability, stored as JSON.

A ``Field`` checks what it is told once, when made; a ``Schema`` is an ordered collection of
them. What a value of a field may be, and how it becomes one, is ``schema/values.py``; the
schema a source's first records imply is ``schema/inference.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import numpy as np

from yogadl_plus import codecs
from yogadl_plus.errors import SchemaError
from yogadl_plus.schema.values import image_converter, numeric_converter, text_converter

__all__ = ["MAX_NAME_BYTES", "Field", "Schema"]

Shape = tuple[int | None, ...]

#: The longest field name, in bytes of UTF-8: a chunk keeps a field's values as a column under
#: an LMDB key of 4 bytes then the name (``cache/keys.py``), and LMDB keys are at most 511 bytes.
MAX_NAME_BYTES = 511 - 4

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
        problem = _name_problem(self.name)
        if problem:
            raise SchemaError(f"{problem}; rename the field (the column, the key)")
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
        """How many of the shape's dims are None (vary between records)."""
        return sum(d is None for d in self.shape)

    @property
    def fixed(self) -> bool:
        """True when every value encodes to exactly ``nbytes`` bytes (bulk-decodable)."""
        return not self.nullable and self.codec.is_fixed_for(self)  # type: ignore[union-attr]

    @property
    def nbytes(self) -> int:
        """Bytes of one value of a fixed shape (dtype size times the dims' product)."""
        return int(self.dtype.itemsize * math.prod(self.shape))  # type: ignore[arg-type]

    def require_numeric(self, codec: codecs.Codec) -> None:
        """SchemaError naming this field unless it holds numbers (for ``codec``'s check)."""
        if self.kind != "numeric":
            raise SchemaError(
                f"field {self.name!r}: {codec!r} stores numeric arrays, not {self.kind}"
            )

    def require_kind(self, codec: codecs.Codec, kind: str) -> None:
        """SchemaError naming this field unless it is of ``kind`` ("str", "bytes", "numeric")."""
        if self.kind != kind:
            raise SchemaError(
                f"field {self.name!r}: {codec!r} stores {kind} values, not {self.dtype_name}"
            )

    def describe(self) -> str:
        """What the field holds, as messages say it: "float32[None, 3]", "str", "int64"."""
        if self.kind != "numeric":
            return self.kind
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]" if self.shape else self.dtype.name

    # --- JSON ---

    def to_json(self) -> dict[str, Any]:
        """The field as the manifest stores it (name, dtype, shape, codec, nullable)."""
        return {
            "name": self.name,
            "dtype": self.dtype_name,
            "shape": list(self.shape),
            "codec": self.codec.to_json(),  # type: ignore[union-attr]
            "nullable": self.nullable,
        }

    @classmethod
    def from_json(cls, spec: Mapping[str, Any]) -> Field:
        """The field ``to_json`` wrote."""
        name = spec["name"]
        # A stored field keeps its name as written: before names were checked, fields that are
        # no column of a chunk (str, bytes, arrays, nullable) could be stored with names longer
        # than MAX_NAME_BYTES, or not UTF-8, and their caches stay readable.
        odd = isinstance(name, str) and _name_problem(name) is not None
        field = cls(
            name="stored" if odd else name,
            dtype=spec["dtype"],
            shape=tuple(spec.get("shape", ())),
            codec=codecs.codec_from_json(spec["codec"]),
            nullable=bool(spec.get("nullable", False)),
        )
        object.__setattr__(field, "name", name)
        return field

    # --- validation ---

    def converter(self) -> Callable[[Any], Any]:
        """A function value -> value in this field's exact type, raising ValueError if it cannot.

        Numbers are converted only when no value changes: numpy values by numpy's 'safe'
        casting rules (int32 -> int64, float32 -> float64, big-endian -> little-endian) and,
        where those rules can still round or overflow (int64 -> float64, datetime64[s] ->
        datetime64[ns]), only when every value comes through exactly; Python scalars and lists
        when converting back gives the same values. The ValueError says what came and what to
        do; the caller adds the record and the field.
        """
        if self.kind == "str":
            return text_converter(str)
        if self.kind == "bytes":
            return text_converter(bytes)
        if isinstance(self.codec, codecs.Image) and self.codec.takes_files(self):
            return image_converter(self.dtype, self.shape)
        return numeric_converter(self.dtype, self.shape)


def _name_problem(name: str) -> str | None:
    """Why ``name`` cannot key a column of a chunk (UTF-8 of at most MAX_NAME_BYTES), or None."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return (
            f"field {name[:40]!r}: its name holds {name[exc.start : exc.end]!r} at position "
            f"{exc.start}, which UTF-8 cannot store (text decoded with errors='surrogateescape'?)"
        )
    if size > MAX_NAME_BYTES:
        return (
            f"field {name[:40]!r}... (a name of {size} bytes of UTF-8): field names are at most "
            f"{MAX_NAME_BYTES} bytes"
        )
    return None


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
        """The fields' names, in order."""
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

    def matching(self, name: str) -> tuple[str, ...]:
        """The names ``name`` stands for, as Petastorm reads a field given by a string: the
        field of that very name if there is one (even where the name holds ``.`` or ``[``),
        else every field whose whole name the regular expression ``name`` matches
        (``re.fullmatch``), in the schema's order; none if none does. ``re.error`` when
        ``name`` is neither a field's name nor a regular expression."""
        if name in self._by_name:
            return (name,)
        pattern = re.compile(name)
        return tuple(n for n in self._by_name if pattern.fullmatch(n))

    def differences_from(self, cached: Schema, *, codecs: bool = False) -> list[str]:
        """What sets this schema apart from the ``cached`` one, a phrase per field ("field 'x'
        is float64 against int64 cached", "field 'z' (str) is not cached", "field 'y'
        (float32[3]) is cached but missing here"): dtypes, shapes, nullability, and codecs if
        ``codecs``. Empty when they hold the same fields, in whatever order."""

        def held(f: Field, codec: bool = False) -> str:
            said = ("nullable " if f.nullable else "") + f.describe()
            return f"{said} {f.codec!r}" if codec else said

        said = []
        for field in self:
            if field.name not in cached:
                said.append(f"field {field.name!r} ({held(field)}) is not cached")
                continue
            then = cached[field.name]
            codec = codecs and field.codec != then.codec
            if codec or held(field) != held(then):
                said.append(
                    f"field {field.name!r} is {held(field, codec)} against "
                    f"{held(then, codec)} cached"
                )
        for field in cached:
            if field.name not in self:
                said.append(f"field {field.name!r} ({held(field)}) is cached but missing here")
        return said

    def to_json(self) -> list[dict[str, Any]]:
        """The schema as the manifest stores it: each field's ``to_json``."""
        return [f.to_json() for f in self.fields]

    @classmethod
    def from_json(cls, spec: Sequence[Mapping[str, Any]]) -> Schema:
        """The schema ``to_json`` wrote."""
        return cls(Field.from_json(s) for s in spec)
