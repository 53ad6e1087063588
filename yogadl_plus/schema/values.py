"""A field's values: what each may be, converted to the field's exact type without changing
a value, and what to say when one cannot be.

Every record written to a cache is checked against the schema, field by field, so that a bad
record fails the build with a message naming the record, the field, what was expected and what
came, instead of producing a cache that decodes to garbage later. ``Field.converter`` hands out
the functions here; the words about a value that is no array (a null inside, a ragged list,
something not a number) are said once, for the build and for inference alike.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = [
    "RAGGED_FIX",
    "cast_exactly",
    "describe_value",
    "first_non_number",
    "holds_none",
    "image_converter",
    "null_inside",
    "numeric_converter",
    "text_converter",
    "where_ragged",
]

_BYTES_LIKE = (bytes, bytearray, memoryview, np.bytes_)


def text_converter(kind: type) -> Callable[[Any], Any]:
    """A function value -> ``kind`` (str or bytes) for a text or binary field, raising
    ValueError that says what came and what to do."""

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
        raise ValueError(f"got {describe_value(value)}")

    return convert


def image_converter(dtype: np.dtype, shape: tuple[int | None, ...]) -> Callable[[Any], Any]:
    """``numeric_converter``'s function for an image field that also takes an image file's
    bytes: ``bytes`` (a subclass kept, as the codec reads it) or bytes-like values as ``bytes``,
    for the codec to check at encode."""
    numeric = numeric_converter(dtype, shape)

    def convert(value: Any) -> Any:
        if isinstance(value, bytes) and not isinstance(value, np.bytes_):
            return value
        if isinstance(value, _BYTES_LIKE):
            return bytes(value)
        if isinstance(value, (str, np.str_)):
            raise ValueError(
                f"got {describe_value(value)}, neither an image array nor an image file's bytes: "
                "give the file's bytes (pathlib.Path(path).read_bytes()), not its path or name"
            )
        return numeric(value)

    return convert


def holds_none(value: Any, depth: int = 0) -> bool:
    """Whether nested lists (or an object array) hold a None somewhere inside."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        value = value.ravel().tolist()
    if isinstance(value, (list, tuple)) and depth <= _MAX_DIMS:
        return any(v is None or holds_none(v, depth + 1) for v in value)
    return False


_MAX_DIMS = 64  # numpy's: lists nested deeper are no array, and are not walked further

# What to do about a null inside an array, said once for the build and for inference.
_NULL_INSIDE_FIX = (
    "an array has no place for a null: fill the nulls with a value (NaN for floats, if that is "
    "what a null means to you), or leave the record out"
)
# What to do about a ragged value, said once for the build and for inference.
RAGGED_FIX = (
    "a field's value is one rectangular array (None dims may differ between records, not "
    "inside one): pad the rows to one length, or store each row in a record of its own"
)


def where_ragged(value: Any) -> str | None:
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


def first_non_number(value: Any, where: tuple[int, ...] = ()) -> str | None:
    """'str '7' at [1]' for the first leaf of nested lists that is not a number, else None."""
    if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 0:
        value = value.item()
    if len(where) > _MAX_DIMS:
        return None
    if isinstance(value, (list, tuple)) or (
        isinstance(value, np.ndarray) and value.dtype == object
    ):
        for i, item in enumerate(value):
            found = first_non_number(item, (*where, i))
            if found:
                return found
        return None
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufcmM":
        return None
    if isinstance(value, (numbers.Number, np.bool_, np.datetime64, np.timedelta64)):
        return None
    at = f" at {''.join(f'[{i}]' for i in where)}" if where else ""
    return f"{describe_value(value)}{at}"


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
    return ValueError(f"got {describe_value(value)}, not convertible to {dtype}: {exc}{held}")


def _not_exact(value: Any, dtype: np.dtype, src: np.ndarray, array: np.ndarray, at: int) -> str:
    was, stored = np.ravel(src)[at], np.ravel(array)[at]
    holding = f" holding {was} at flat index {at}" if src.ndim else ""
    return (
        f"got {describe_value(value)}{holding}, which {dtype} cannot hold exactly "
        f"(it would be stored as {stored})"
    )


def numeric_converter(dtype: np.dtype, shape: tuple[int | None, ...]) -> Callable[[Any], Any]:
    """A function that takes a value of a numeric field (its ``dtype`` and ``shape``, None for
    a variable size) to an array of that dtype and shape, holding the values exactly, or
    raises ValueError saying what came and why it cannot."""
    scalar_type = dtype.type
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
            f"got {describe_value(value)}, over the largest {np.dtype(scalar_type)} ({largest:g})"
        )
    try:
        number = scalar_type(value)
        same = number.item() == value or value != value  # NaN stays NaN
    except (OverflowError, ValueError, TypeError, RuntimeWarning) as exc:
        raise _not_convertible(value, np.dtype(scalar_type), exc) from None
    if not same:
        raise ValueError(
            f"got {describe_value(value)}, which {np.dtype(scalar_type)} cannot hold exactly "
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
        what = describe_value(src[()] if src.ndim == 0 else src)
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
        if holds_none(value):
            raise ValueError(null_inside(value)) from None
        ragged = where_ragged(value)
        if ragged is not None:
            raise ValueError(f"got a ragged nested list: {ragged}; {RAGGED_FIX}") from None
        raise ValueError(f"got {describe_value(value)}, not convertible: {exc}") from None
    if src.dtype.kind not in "biufcmM":
        if holds_none(value):
            raise ValueError(null_inside(value))
        odd = first_non_number(value)
        if odd is not None:
            raise ValueError(
                f"got {describe_value(value)} holding {odd}, not a number: " + _text_hint(dtype)
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


def null_inside(value: Any) -> str:
    """What to say of a value that holds a None inside, and what to do about it."""
    return f"got {describe_value(value)} with a null (None) inside; {_NULL_INSIDE_FIX}"


def _not_numbers(value: Any, dtype: np.dtype) -> ValueError:
    """The error for a value of a numeric field that holds no numbers at all."""
    if isinstance(value, (str, np.str_)):
        return ValueError(f"got {describe_value(value)}, not a number: {_text_hint(dtype)}")
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
    return ValueError(f"got {describe_value(value)}")


def describe_value(value: Any) -> str:
    """A value as messages name it, short: "int64 7", "a list of length 3", "str 'x'"."""
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
