"""The schema is data: named fields with dtype, shape, codec and nullability, stored as JSON.

Every record written to a cache is checked against the schema, field by field, so that a bad
record fails the build with a message naming the record, the field, what was expected and what
came, instead of producing a cache that decodes to garbage later.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import numpy as np

from yogadl_plus import codecs
from yogadl_plus.errors import SchemaError

__all__ = [
    "MAX_NAME_BYTES",
    "Field",
    "Schema",
    "cast_exactly",
    "infer_field",
    "infer_schema",
    "infer_value",
]

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
            return _convert_text(str)
        if self.kind == "bytes":
            return _convert_text(bytes)
        return _numeric_converter(self)


_BYTES_LIKE = (bytes, bytearray, memoryview, np.bytes_)


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


def _convert_text(kind: type) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if type(value) is kind:
            return value
        if kind is str and isinstance(value, (str, np.str_)):
            return str(value)
        if kind is bytes and isinstance(value, _BYTES_LIKE):
            return bytes(value)
        if kind is str and isinstance(value, _BYTES_LIKE):
            raise ValueError("got bytes; decode it to str first, or declare the field as bytes")
        if kind is bytes and isinstance(value, (str, np.str_)):
            raise ValueError(
                "got str; encode it to bytes first (value.encode()), or declare the field as str"
            )
        raise ValueError(f"got {_describe_value(value)}")

    return convert


def _holds_none(value: Any, depth: int = 0) -> bool:
    if isinstance(value, np.ndarray) and value.dtype == object:
        value = value.ravel().tolist()
    if isinstance(value, (list, tuple)) and depth <= _MAX_DIMS:
        return any(v is None or _holds_none(v, depth + 1) for v in value)
    return False


_MAX_DIMS = 64  # numpy's: lists nested deeper are no array, and are not walked further

# What to do about a null inside an array, said once for the build and for inference.
_NULL_INSIDE_FIX = (
    "an array has no place for a null: fill the nulls with a value (NaN for floats, if that is "
    "what a null means to you), or leave the record out"
)
# What to do about a ragged value, said once for the build and for inference.
_RAGGED_FIX = (
    "a field's value is one rectangular array (None dims may differ between records, not "
    "inside one): pad the rows to one length, or store each row in a record of its own"
)


def _ragged(value: Any) -> str | None:
    """Where nested lists stop being rectangular ('item [1] has length 1 where item [0] has
    length 2'), or None when they are rectangular."""

    def say(where: tuple[int, ...], shape: tuple[int, ...]) -> str:
        item = "item " + "".join(f"[{i}]" for i in where)
        if not shape:
            return f"{item} is a single value"
        return f"{item} has " + (f"length {shape[0]}" if len(shape) == 1 else f"shape {shape}")

    def shape_of(v: Any, where: tuple[int, ...], depth: int) -> tuple[int, ...] | str:
        if isinstance(v, np.ndarray) and v.dtype != object:
            return v.shape
        if isinstance(v, np.ndarray) and v.ndim == 0:
            return ()
        if not isinstance(v, (list, tuple, np.ndarray)) or depth > _MAX_DIMS:
            return ()  # a single value
        first: tuple[int, ...] | None = None
        for i, item in enumerate(v):
            got = shape_of(item, (*where, i), depth + 1)
            if isinstance(got, str):
                return got
            if first is None:
                first = got
            elif got != first:
                return f"{say((*where, i), got)} where {say((*where, 0), first)}"
        return (len(v), *(first or ()))

    found = shape_of(value, (), 0)
    return found if isinstance(found, str) else None


def _first_non_number(value: Any, where: tuple[int, ...] = ()) -> str | None:
    """'str '7' at [1]' for the first leaf of nested lists that is not a number, else None."""
    if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 0:
        value = value.item()
    if len(where) > _MAX_DIMS:
        return None
    if isinstance(value, (list, tuple)) or (
        isinstance(value, np.ndarray) and value.dtype == object
    ):
        for i, item in enumerate(value):
            found = _first_non_number(item, (*where, i))
            if found:
                return found
        return None
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufcmM":
        return None
    if isinstance(value, (numbers.Number, np.bool_, np.datetime64, np.timedelta64)):
        return None
    at = f" at {''.join(f'[{i}]' for i in where)}" if where else ""
    return f"{_describe_value(value)}{at}"


def _text_hint(dtype: np.dtype) -> str:
    if dtype.kind in "mM":
        return "convert it with np.datetime64(...) / np.timedelta64(...) first"
    return "parse it into numbers first, or declare the field as str"


@functools.lru_cache(maxsize=256)
def _cast_can_change(src: np.dtype, dst: np.dtype) -> bool:
    """True for numpy 'safe' casts that can still change a value: wide ints into floats (which
    round them) and datetimes/timedeltas into finer units (which overflow int64 silently)."""
    if src.kind in "iu" and dst.kind in "fc":
        info = np.iinfo(src)
        return max(-int(info.min), int(info.max)) > 2 ** (np.finfo(dst).nmant + 1)
    if src.kind in "mM" and dst.kind in "mM":
        return np.datetime_data(src) != np.datetime_data(dst)
    return False


def _first_changed(array: np.ndarray, src: np.ndarray) -> int | None:
    """The flat index of the first value ``array`` does not hold exactly as in ``src`` (same
    shape), or None when every value came through.

    numpy compares int64 with floats as float64, rounding ints beyond 2**53 first, which hides
    the very rounding asked about, and casts datetimes modulo 2**64: such ints meet floats as
    Python numbers (which compare exactly) and datetimes are compared after the way back.
    """
    if src.dtype.kind in "mM":
        with np.errstate(over="ignore", invalid="ignore"):
            back = array.astype(src.dtype)
        changed = np.flatnonzero(back.view(np.uint64) != src.view(np.uint64))
        return int(changed[0]) if changed.size else None
    ints = src if src.dtype.kind in "iu" else array if array.dtype.kind in "iu" else None
    if src.dtype.kind != "O" and (
        ints is None or not ints.size or (ints.min() >= -(2**53) and ints.max() <= 2**53)
    ):
        with np.errstate(invalid="ignore"):
            same = array == src
            if array.dtype.kind in "fc" and src.dtype.kind in "fc":
                same |= np.isnan(array) & np.isnan(src)  # NaN stays NaN
        changed = np.flatnonzero(~same)
        return int(changed[0]) if changed.size else None
    got = np.ravel(array).tolist()
    want = np.ravel(np.asarray(src, dtype=object)).tolist()
    for i, (a, b) in enumerate(zip(got, want)):
        if isinstance(b, np.generic):
            b = b.item()
        if not (a == b or (a != a and b != b)):
            return i
    return None


def _not_convertible(value: Any, dtype: np.dtype, exc: BaseException) -> ValueError:
    held = ""
    if dtype.kind in "iu" and isinstance(exc, OverflowError):
        info = np.iinfo(dtype)
        held = f" ({dtype} holds [{info.min}, {info.max}])"
    return ValueError(f"got {_describe_value(value)}, not convertible to {dtype}: {exc}{held}")


def _not_exact(value: Any, dtype: np.dtype, src: np.ndarray, array: np.ndarray, at: int) -> str:
    was, stored = np.ravel(src)[at], np.ravel(array)[at]
    holding = f" holding {was} at flat index {at}" if src.ndim else ""
    return (
        f"got {_describe_value(value)}{holding}, which {dtype} cannot hold exactly "
        f"(it would be stored as {stored})"
    )


def _numeric_converter(field: Field) -> Callable[[Any], Any]:
    """A function that takes a value of numeric ``field`` to an array of its dtype and shape,
    holding the values exactly, or raises ValueError saying what came and why it cannot."""
    dtype: np.dtype = field.dtype
    scalar_type = dtype.type
    shape = field.shape
    fixed_shape = None not in shape
    ndim = len(shape)
    # Python ints (and floats into floats) for a shape-() field: one numpy scalar, checked
    # exactly, instead of two arrays built and compared.
    python_ints = shape == () and dtype.kind in "iuf"
    python_floats = shape == () and dtype.kind == "f"
    largest = float(np.finfo(dtype).max) if dtype.kind == "f" and dtype.itemsize < 8 else None
    # Kinds of numpy values whose 'safe' cast into this dtype may still change values.
    recheck = "iu" if dtype.kind in "fc" else "mM" if dtype.kind in "mM" else ""

    def shape_ok(got: tuple[int, ...]) -> bool:
        if fixed_shape:
            return got == shape
        return len(got) == ndim and all(e is None or e == g for e, g in zip(shape, got))

    def convert(value: Any) -> Any:
        kind = type(value)
        if kind is np.ndarray:
            array = value if value.dtype == dtype else _cast_array(value, dtype, recheck)
        elif (kind is int and python_ints) or (kind is float and python_floats):
            return _scalar_from_python(value, scalar_type, largest)
        elif isinstance(value, (np.ndarray, np.generic)):
            array = _array_from_numpy(value, dtype, recheck)
        elif isinstance(value, (bool, int, float, complex, list, tuple)):
            array = _array_from_python(value, dtype)
        else:
            raise _not_numbers(value, dtype)
        if not shape_ok(array.shape):
            raise ValueError(f"got shape {array.shape}")
        return array

    return convert


def _scalar_from_python(
    value: int | float, scalar_type: type[np.generic], largest: float | None
) -> np.generic:
    """A Python int or float as one numpy scalar of ``scalar_type`` (whose largest finite
    value is ``largest``, for floats narrower than float64), holding it exactly."""
    if largest is not None and largest < abs(value) < math.inf:
        # Refused before numpy overflows to inf and warns about it.
        raise ValueError(
            f"got {_describe_value(value)}, over the largest {np.dtype(scalar_type)} ({largest:g})"
        )
    try:
        number = scalar_type(value)
        same = number.item() == value or value != value  # NaN stays NaN
    except (OverflowError, ValueError, TypeError, RuntimeWarning) as exc:
        raise _not_convertible(value, np.dtype(scalar_type), exc) from None
    if not same:
        raise ValueError(
            f"got {_describe_value(value)}, which {np.dtype(scalar_type)} cannot hold exactly "
            f"(it would be stored as {number.item()!r})"
        )
    return number


def _array_from_numpy(value: np.ndarray | np.generic, dtype: np.dtype, recheck: str) -> np.ndarray:
    """A numpy scalar or array subclass (a masked array without masked values) as an array of
    ``dtype``, cast as ``_cast_array`` does."""
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        raise ValueError(
            f"got a masked array with {np.ma.count_masked(value)} masked value(s); "
            "fill them (value.filled(...)) or leave the record out"
        )
    array = np.asarray(value)
    return array if array.dtype == dtype else _cast_array(array, dtype, recheck)


def cast_exactly(src: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A numeric array as ``dtype`` by the rules a field's values follow (``Field.converter``):
    numpy's 'safe' casts only, and only where every value comes through; ValueError says what
    came otherwise."""
    recheck = "iu" if dtype.kind in "fc" else "mM" if dtype.kind in "mM" else ""
    return _cast_array(src, dtype, recheck)


def _cast_array(src: np.ndarray, dtype: np.dtype, recheck: str) -> np.ndarray:
    """``src`` as an array of ``dtype``: only by numpy's 'safe' casts, and, from the kinds in
    ``recheck`` (whose safe casts can still change values), only if every value came through."""
    if src.dtype.kind == "O":
        return _array_from_python(src, dtype)
    if src.dtype.kind not in "biufcmM":
        what = _describe_value(src[()] if src.ndim == 0 else src)
        if src.dtype.kind in "US":
            raise ValueError(f"got {what}, not numbers: {_text_hint(dtype)}")
        raise ValueError(f"got {what}, not numbers: store each of its fields as a field of its own")
    if not np.can_cast(src.dtype, dtype, "safe"):
        raise ValueError(
            f"got dtype {src.dtype} which does not cast to {dtype} without loss; "
            f"convert it yourself or declare the field as {src.dtype}"
        )
    array = src.astype(dtype)
    if src.dtype.kind in recheck and _cast_can_change(src.dtype, dtype):
        changed = _first_changed(array, src)
        if changed is not None:
            raise ValueError(
                f"{_not_exact(src, dtype, src, array, changed)}; declare the field as "
                f"{src.dtype}, or convert the values yourself"
            )
    return array


def _array_from_python(value: Any, dtype: np.dtype) -> np.ndarray:
    """Python numbers, or (nested) lists and tuples of them, as an array of ``dtype`` that
    holds every value exactly."""
    try:
        src = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:
        if _holds_none(value):
            raise ValueError(_null_inside(value)) from None
        ragged = _ragged(value)
        if ragged is not None:
            raise ValueError(f"got a ragged nested list: {ragged}; {_RAGGED_FIX}") from None
        raise ValueError(f"got {_describe_value(value)}, not convertible: {exc}") from None
    if src.dtype.kind not in "biufcmM":
        if _holds_none(value):
            raise ValueError(_null_inside(value))
        odd = _first_non_number(value)
        if odd is not None:
            raise ValueError(
                f"got {_describe_value(value)} holding {odd}, not a number: " + _text_hint(dtype)
            )
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            array = np.asarray(value, dtype=dtype)
    except (OverflowError, ValueError, TypeError, RuntimeWarning) as exc:
        raise _not_convertible(value, dtype, exc) from None
    if src.dtype.kind in "fc" and src.size and np.abs(src).max() >= 2**53:
        # numpy made floats of the list, maybe of ints beyond 2**53 among floats (which
        # it rounds): compare with the list's own values.
        src = np.asarray(value, dtype=object)
    if src.dtype != dtype:
        changed = _first_changed(array, src)
        if changed is not None:
            raise ValueError(_not_exact(value, dtype, src, array, changed))
    return array


def _null_inside(value: Any) -> str:
    return f"got {_describe_value(value)} with a null (None) inside; {_NULL_INSIDE_FIX}"


def _not_numbers(value: Any, dtype: np.dtype) -> ValueError:
    """The error for a value of a numeric field that holds no numbers at all."""
    if isinstance(value, (str, np.str_)):
        return ValueError(f"got {_describe_value(value)}, not a number: {_text_hint(dtype)}")
    if isinstance(value, _BYTES_LIKE):
        return ValueError(
            f"got {type(value).__name__} of {memoryview(value).nbytes} bytes, not numbers: "
            f"np.frombuffer(value, {dtype.name!r}) reads bytes that hold an array, or "
            "declare the field as bytes"
        )
    if isinstance(value, Mapping):
        return ValueError(
            f"got a dict (keys {sorted(map(str, value))[:8]}); a field holds one array, "
            "not a nested record: make each key a field of its own"
        )
    return ValueError(f"got {_describe_value(value)}")


def _describe_value(value: Any) -> str:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (np.str_, np.bytes_)):
        return f"{'str' if isinstance(value, np.str_) else 'bytes'} {value.item()!r}"[:80]
    if isinstance(value, np.generic):
        return f"{value.dtype} {value}"[:80]
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
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


def infer_value(name: str, value: Any, index: int) -> tuple[str, np.dtype | None, tuple[int, ...]]:
    """What one value (not None) of record ``index``'s field ``name`` holds: ("str" | "bytes",
    None, ()) or ("numeric", its dtype, its shape); a SchemaError naming the record and field
    says why a value holds no array (a null inside, a ragged list, something not a number)."""
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
    where = f"record {index}, field {name!r}"
    if isinstance(value, (np.ndarray, np.generic, list, tuple)):
        try:
            array = np.asarray(value)
        except (ValueError, TypeError, OverflowError) as exc:
            if _holds_none(value):
                raise SchemaError(f"{where}: {_null_inside(value)}") from None
            ragged = _ragged(value)
            if ragged is not None:
                raise SchemaError(
                    f"{where}: cannot infer a field from a ragged nested list: {ragged}; "
                    f"{_RAGGED_FIX}"
                ) from None
            raise SchemaError(
                f"{where}: cannot infer a field from {_describe_value(value)} ({exc}); "
                "pass schema= to cache_dataset"
            ) from None
        else:
            if array.dtype.kind in "biufcmM":
                return "numeric", array.dtype, array.shape
            if array.dtype.kind in "US" and array.ndim == 0:
                return ("str" if array.dtype.kind == "U" else "bytes"), None, ()
            if _holds_none(value):
                raise SchemaError(f"{where}: {_null_inside(value)}")
    if isinstance(value, Mapping):
        raise SchemaError(
            f"{where}: cannot infer a field from a dict (keys {sorted(map(str, value))[:8]}); "
            "a field holds one array, not a nested record: make each key a field of its own"
        )
    what = _describe_value(value)
    if isinstance(value, (list, tuple)) or (
        isinstance(value, np.ndarray) and value.dtype == object
    ):
        odd = _first_non_number(value)
        what += f" holding {odd or 'numbers no one numpy dtype holds (ints beyond 64 bits?)'}"
    raise SchemaError(
        f"{where}: cannot infer a field from {what}; records hold numpy arrays or scalars, "
        "Python numbers or lists of them, str or bytes. Pass schema= to cache_dataset."
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
                seen[name].append(infer_value(name, value, index))
    fields = []
    for name, found in seen.items():
        if not found:
            raise SchemaError(f"field {name!r} is None in all first records; pass schema=")
        fields.append(infer_field(name, found, nullable[name]))
    return Schema(fields)


def infer_field(
    name: str, found: Sequence[tuple[str, np.dtype | None, tuple[int, ...]]], nullable: bool
) -> Field:
    """The field that holds values of what ``infer_value`` found (at least one): dims that
    differ are None, numeric dtypes that differ are promoted only where that is lossless."""
    kinds = {k for k, _, _ in found}
    if len(kinds) > 1:
        raise SchemaError(f"field {name!r} holds different kinds of values: {sorted(kinds)}")
    kind = kinds.pop()
    if kind != "numeric":
        return Field(name, kind, (), nullable=nullable)
    dtypes = list(dict.fromkeys(d for _, d, _ in found if d is not None))
    dtype = dtypes[0]
    for other in dtypes[1:]:
        wider = np.promote_types(dtype, other)
        if dtype.kind in "iu" and other.kind in "iu" and wider.kind not in "iu":
            # int64 with uint64: numpy's common type is float64, which rounds big values.
            raise SchemaError(
                f"field {name!r} holds both {dtype} and {other} values, and no integer "
                "dtype holds both; pass schema= with the dtype to store"
            )
        dtype = wider
    shapes = {s for _, _, s in found}
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        raise SchemaError(f"field {name!r} has values of different ranks: {sorted(shapes)}")
    shape = tuple(
        d if len({s[i] for s in shapes}) == 1 else None for i, d in enumerate(found[0][2])
    )
    return Field(name, dtype, shape, nullable=nullable)
