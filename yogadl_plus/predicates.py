"""Record filters applied at the boundary: ``stream(predicate=...)`` keeps the records they accept.

A predicate says which fields it reads (``get_fields()``) so that the reader decodes only those
for the records it rejects, and it decides either one record at a time (``include``) or a whole
batch of columns at once (``include_batch``), vectorized with numpy where the data allows. Both
answer the same for the same data. Predicates hold plain data only, so they pickle into worker
processes (``in_lambda`` holds the user's function, which must then be picklable too).

``in_pseudorandom_split`` hashes with a keyed splitmix64 (integers and floats, vectorized) or a
keyed ``hashlib.blake2b`` (everything else), never Python's salted ``hash()``, so a split is the
same in every process, Python run and machine.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import struct
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from yogadl_plus.checks import check_int
from yogadl_plus.errors import SchemaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.splitmix import MASK64, splitmix64, splitmix64_array

__all__ = [
    "Predicate",
    "in_intersection",
    "in_lambda",
    "in_negate",
    "in_pseudorandom_split",
    "in_reduce",
    "in_set",
]

Mask = npt.NDArray[np.bool_]

# Given values that are numpy number scalars are kept as the Python numbers they hold, so that
# the exactness check of a lookup compares Python numbers (np.float32(0.1) == 0.1 is True under
# numpy's promotion rules, yet 0.1 is no float32 value) and repr shows plain numbers.
_NUMBER_SCALARS = (np.bool_, np.number)
_FAST_KINDS = "biufc"  # dtypes np.isin compares exactly once the lookup has the column's dtype
_REPR_ITEMS = 8


def _norm(value: Any) -> Any:
    return value.item() if isinstance(value, _NUMBER_SCALARS) else value


def _check_field_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty str naming a field, got {name!r}")
    return name


def _get_value(values: Mapping[str, Any], name: str, who: Predicate) -> Any:
    try:
        return values[name]
    except KeyError:
        raise KeyError(
            f"{who!r} reads field {name!r}, missing from the values given ({sorted(values)})"
        ) from None


def _get_column(columns: Mapping[str, Any], name: str, n: int, who: Predicate) -> Any:
    try:
        column = columns[name]
    except KeyError:
        raise KeyError(
            f"{who!r} reads field {name!r}, missing from the columns given ({sorted(columns)})"
        ) from None
    if len(column) != n:
        raise ValueError(f"{who!r}: column {name!r} has {len(column)} rows, expected n={n}")
    return column


def _as_mask(result: Any, n: int, who: str) -> Mask:
    """``result`` as a bool array of length n, or a ValueError saying what came instead."""
    array = np.asarray(result)
    if array.dtype != np.bool_ or array.shape != (n,):
        raise ValueError(
            f"{who} must give a bool array of shape ({n},), got {array.dtype} with shape "
            f"{array.shape}"
        )
    return array


def _as_bool(result: Any, who: str) -> bool:
    if isinstance(result, (bool, np.bool_)):
        return bool(result)
    raise ValueError(f"{who} must return a bool, got {result!r} of type {type(result).__name__}")


def _field_of(pred: Predicate, schema: Schema, name: str) -> Field:
    if name not in schema:
        raise SchemaError(
            f"{pred!r} reads field {name!r}, which the schema lacks; it has {list(schema.names)}"
        )
    return schema[name]


def _repr_values(values: frozenset[Any]) -> str:
    try:
        items = sorted(values)
    except TypeError:
        items = sorted(values, key=repr)
    shown = ", ".join(repr(v) for v in items[:_REPR_ITEMS])
    if len(items) > _REPR_ITEMS:
        return f"{{{shown}, ... ({len(items)} values)}}"
    return f"{{{shown}}}" if items else "set()"


class Predicate(ABC):
    """A record filter: subclass it, or build one with ``in_set``, ``in_lambda`` and friends."""

    @abstractmethod
    def get_fields(self) -> frozenset[str]:
        """The fields this predicate reads: the reader decodes only these to decide."""

    @abstractmethod
    def include(self, values: Mapping[str, Any]) -> bool:
        """Whether to keep the record whose decoded values of ``get_fields()`` are given."""

    def include_batch(self, columns: Mapping[str, Any], n: int) -> Mask:
        """A bool array saying which of n records to keep, from columns as
        ``DataRef.get_batch`` returns them. This default asks ``include`` row by row."""
        names = sorted(self.get_fields())
        cols = [_get_column(columns, name, n, self) for name in names]
        rows = zip(*cols) if cols else ((),) * n
        return np.fromiter(
            (self.include(dict(zip(names, row))) for row in rows), dtype=np.bool_, count=n
        )

    def check(self, schema: Schema) -> None:
        """Raises SchemaError naming the field when this predicate cannot read ``schema``, and
        ValueError when it names no field at all."""
        if not self.get_fields():
            raise ValueError(
                f"the predicate {self!r} names no field (get_fields() is empty): a predicate "
                "decides from the fields it names, and only those are decoded for it; return "
                "their names from get_fields()"
            )
        for name in sorted(self.get_fields()):
            _field_of(self, schema, name)

    @abstractmethod
    def __repr__(self) -> str: ...


class _ValueSet:
    """A set of values with an exact, vectorized membership test for numeric arrays."""

    def __init__(self, what: str, values: Iterable[Any]) -> None:
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise ValueError(
                f"{what}: values must be an iterable of values (a list or a set), got {values!r}"
            )
        kept = set()
        for v in values:
            v = _norm(v)
            try:
                hash(v)
            except TypeError:
                raise ValueError(
                    f"{what}: values must be hashable scalars, got {v!r} of type {type(v).__name__}"
                ) from None
            # NaN equals nothing, not even itself, so no record value can match it.
            if isinstance(v, (float, complex)) and v != v:
                continue
            kept.add(v)
        self.values = frozenset(kept)
        self._lookups: dict[np.dtype, np.ndarray] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"values": self.values}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.values = state["values"]
        self._lookups = {}

    def contains(self, value: Any) -> bool:
        # Numpy number scalars hash and compare like the Python numbers they hold.
        return value in self.values

    def _lookup(self, dtype: np.dtype) -> np.ndarray:
        """The values that a ``dtype`` element can equal, as a ``dtype`` array for np.isin.

        A value is kept only when converting it to ``dtype`` and back gives it exactly, so that
        np.isin agrees with Python's ``==`` (2.5 matches no int, 2**70 no int64, 0.1 no float32).
        """
        lookup = self._lookups.get(dtype)
        if lookup is None:
            kept = []
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                for v in self.values:
                    if not isinstance(v, (bool, int, float, complex)):
                        continue
                    try:
                        converted = np.array(v, dtype=dtype)
                    except (OverflowError, ValueError, TypeError):
                        continue
                    if converted.item() == v:
                        kept.append(converted)
            lookup = np.unique(np.array(kept, dtype=dtype))
            self._lookups[dtype] = lookup
        return lookup

    def isin(self, array: np.ndarray) -> Mask:
        """Elementwise membership, same shape as ``array``."""
        if array.dtype.kind in _FAST_KINDS:
            return np.isin(array, self._lookup(array.dtype))
        flat = np.fromiter((self.contains(v) for v in array.ravel()), np.bool_, array.size)
        return flat.reshape(array.shape)

    def any_in(self, value: Any) -> bool:
        """Whether any element of an array value (ndarray, list or tuple) is in the set."""
        if value is None:
            return False
        if isinstance(value, np.ndarray):
            return bool(self.isin(value).any())
        if isinstance(value, (list, tuple)):
            return any(self.contains(v) for v in value)
        raise TypeError(f"expected an array value, got {value!r} of type {type(value).__name__}")


class _FieldInValues(Predicate):
    """A predicate on one field and a set of values (``kind`` names it in messages)."""

    kind = ""

    def __init__(self, field: str, values: Iterable[Any]) -> None:
        self.field = _check_field_name(f"{self.kind}: field", field)
        self._set = _ValueSet(self.kind, values)

    def get_fields(self) -> frozenset[str]:
        return frozenset((self.field,))


class _InSet(_FieldInValues):
    kind = "in_set"

    def _unhashable(self, value: Any) -> TypeError:
        return TypeError(
            f"{self!r}: field {self.field!r} holds {type(value).__name__} values, and in_set "
            "compares whole scalar values; for arrays use in_intersection or in_lambda"
        )

    def include(self, values: Mapping[str, Any]) -> bool:
        value = _get_value(values, self.field, self)
        try:
            return self._set.contains(value)
        except TypeError:
            raise self._unhashable(value) from None

    def include_batch(self, columns: Mapping[str, Any], n: int) -> Mask:
        column = _get_column(columns, self.field, n, self)
        if isinstance(column, np.ndarray):
            if column.ndim != 1:
                raise self._unhashable(column[0])
            return self._set.isin(column)
        values = self._set.values
        try:
            return np.fromiter((v in values for v in column), dtype=np.bool_, count=n)
        except TypeError:
            for v in column:
                if not _hashable(v):
                    raise self._unhashable(v) from None
            raise

    def check(self, schema: Schema) -> None:
        field = _field_of(self, schema, self.field)
        if field.shape:
            raise SchemaError(
                f"{self!r}: field {self.field!r} holds arrays ({field.describe()}), and in_set "
                "compares whole scalar values; use in_intersection for 'any element in values'"
            )

    def __repr__(self) -> str:
        return f"in_set({self.field!r}, {_repr_values(self._set.values)})"


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


class _InIntersection(_FieldInValues):
    kind = "in_intersection"

    def include(self, values: Mapping[str, Any]) -> bool:
        return self._set.any_in(_get_value(values, self.field, self))

    def include_batch(self, columns: Mapping[str, Any], n: int) -> Mask:
        column = _get_column(columns, self.field, n, self)
        if isinstance(column, np.ndarray):
            if column.ndim < 2:
                raise TypeError(
                    f"{self!r}: column {self.field!r} holds scalars (shape {column.shape}); "
                    "in_intersection needs an array field"
                )
            per_row = math.prod(column.shape[1:])
            return np.any(self._set.isin(column).reshape(n, per_row), axis=1)
        any_in = self._set.any_in
        return np.fromiter((any_in(v) for v in column), dtype=np.bool_, count=n)

    def check(self, schema: Schema) -> None:
        field = _field_of(self, schema, self.field)
        if field.kind != "numeric" or not field.shape:
            raise SchemaError(
                f"{self!r}: field {self.field!r} is {field.describe()}, not an array; "
                "in_intersection needs a numeric array field (use in_set for scalars)"
            )

    def __repr__(self) -> str:
        return f"in_intersection({self.field!r}, {_repr_values(self._set.values)})"


class _InLambda(Predicate):
    def __init__(
        self, fields: Sequence[str] | str, func: Callable[..., Any], vectorized: bool = False
    ) -> None:
        if isinstance(fields, str):
            fields = [fields]
        if not isinstance(fields, Iterable):
            raise ValueError(f"in_lambda: fields must be a list of field names, got {fields!r}")
        self.fields = tuple(_check_field_name("in_lambda: each field", f) for f in fields)
        if not self.fields:
            raise ValueError("in_lambda: fields must name at least one field, got none")
        if len(set(self.fields)) != len(self.fields):
            raise ValueError(f"in_lambda: fields must not repeat a name, got {list(self.fields)}")
        if not callable(func):
            raise ValueError(
                f"in_lambda: func must be callable, got {func!r} of type {type(func).__name__}"
            )
        if not isinstance(vectorized, (bool, np.bool_)):
            raise ValueError(f"in_lambda: vectorized must be a bool, got {vectorized!r}")
        self.func = func
        self.vectorized = bool(vectorized)
        # Which fields get_batch stacks into arrays (the rest come as lists): known once
        # check() saw the schema, so that include() can hand a vectorized func the same kind
        # of one-row columns.
        self._stacked: frozenset[str] | None = None

    def get_fields(self) -> frozenset[str]:
        return frozenset(self.fields)

    def include(self, values: Mapping[str, Any]) -> bool:
        args = [_get_value(values, f, self) for f in self.fields]
        if not self.vectorized:
            return _as_bool(self.func(*args), f"{self!r}: func")
        columns = [self._one_row(f, v) for f, v in zip(self.fields, args)]
        return bool(_as_mask(self.func(*columns), 1, f"{self!r}: func")[0])

    def _one_row(self, name: str, value: Any) -> Any:
        if self._stacked is not None:
            stacked = name in self._stacked
        else:
            stacked = isinstance(value, (np.ndarray, np.generic))
        return np.asarray(value)[np.newaxis] if stacked else [value]

    def include_batch(self, columns: Mapping[str, Any], n: int) -> Mask:
        cols = [_get_column(columns, f, n, self) for f in self.fields]
        if self.vectorized:
            if n == 0:
                return np.zeros(0, dtype=np.bool_)
            return _as_mask(self.func(*cols), n, f"{self!r}: func")
        func, who = self.func, f"{self!r}: func"
        return np.fromiter((_as_bool(func(*row), who) for row in zip(*cols)), np.bool_, n)

    def check(self, schema: Schema) -> None:
        fields = [_field_of(self, schema, f) for f in self.fields]
        self._stacked = frozenset(f.name for f in fields if f.fixed)

    def __repr__(self) -> str:
        fields = self.fields[0] if len(self.fields) == 1 else list(self.fields)
        return f"in_lambda({fields!r}, {self.func!r}, vectorized={self.vectorized})"


class _InNegate(Predicate):
    def __init__(self, pred: Predicate) -> None:
        if not isinstance(pred, Predicate):
            raise ValueError(
                f"in_negate: pred must be a Predicate, got {pred!r} of type {type(pred).__name__}"
            )
        self.pred = pred

    def get_fields(self) -> frozenset[str]:
        return self.pred.get_fields()

    def include(self, values: Mapping[str, Any]) -> bool:
        return not self.pred.include(values)

    def include_batch(self, columns: Mapping[str, Any], n: int) -> Mask:
        mask = _as_mask(self.pred.include_batch(columns, n), n, f"{self.pred!r}.include_batch")
        return np.logical_not(mask)

    def check(self, schema: Schema) -> None:
        self.pred.check(schema)

    def __repr__(self) -> str:
        return f"in_negate({self.pred!r})"


class _InReduce(Predicate):
    def __init__(self, preds: Iterable[Predicate], reduce_func: Callable[..., bool]) -> None:
        if isinstance(preds, Predicate) or not isinstance(preds, Iterable):
            raise ValueError(f"in_reduce: preds must be a list of Predicates, got {preds!r}")
        self.preds = tuple(preds)
        if not self.preds:
            raise ValueError("in_reduce: preds must hold at least one Predicate, got none")
        for p in self.preds:
            if not isinstance(p, Predicate):
                raise ValueError(
                    f"in_reduce: preds must hold Predicates, got {p!r} of type {type(p).__name__}"
                )
        if reduce_func is not all and reduce_func is not any:
            raise ValueError(
                f"in_reduce: reduce_func must be the builtin all or any, got {reduce_func!r}"
            )
        self.reduce_func = reduce_func

    def get_fields(self) -> frozenset[str]:
        return frozenset().union(*(p.get_fields() for p in self.preds))

    def include(self, values: Mapping[str, Any]) -> bool:
        # Short-circuits like the builtin: later predicates may not even be asked.
        return bool(self.reduce_func(p.include(values) for p in self.preds))

    def include_batch(self, columns: Mapping[str, Any], n: int) -> Mask:
        conjunction = self.reduce_func is all
        mask = np.full(n, conjunction, dtype=np.bool_)
        for p in self.preds:
            if n == 0 or (not mask.any() if conjunction else mask.all()):
                break  # decided for every row: the other predicates need not run
            got = _as_mask(p.include_batch(columns, n), n, f"{p!r}.include_batch")
            mask = (mask & got) if conjunction else (mask | got)
        return mask

    def check(self, schema: Schema) -> None:
        for p in self.preds:
            p.check(schema)

    def __repr__(self) -> str:
        return f"in_reduce({list(self.preds)!r}, {self.reduce_func.__name__})"


_U53 = 1 << 53  # a hash's top 53 bits are its position u * 2**53 in [0, 1)
_CANONICAL_NAN = 0x7FF8000000000000
_INT64_MIN = -(1 << 63)


def _float_bits(value: float) -> int:
    value = value + 0.0  # -0.0 == 0.0, so both must hash alike
    if value != value:
        return _CANONICAL_NAN
    return int.from_bytes(struct.pack("<d", value), "little")


def _canonical_array_bytes(array: np.ndarray) -> bytes:
    kind = array.dtype.kind
    if kind in "bi":
        prefix, data = b"i", array.astype("<i8")
    elif kind == "u":
        prefix, data = b"i", array.astype("<u8")  # same bits as int64 for equal values
    elif kind == "f":
        floats = array.astype(np.float64) + 0.0
        bits = floats.view(np.uint64).copy()
        bits[np.isnan(floats)] = _CANONICAL_NAN
        prefix, data = b"f", bits.astype("<u8")
    elif kind == "c":
        prefix, data = b"c", (array.astype(np.complex128) + 0j).astype("<c16")
    elif kind in "mM":
        unit, count = np.datetime_data(array.dtype)
        prefix = kind.encode() + f"{count}{unit}".encode()
        data = array.view(np.int64).astype("<i8")
    else:
        raise TypeError(f"cannot hash an array of dtype {array.dtype} for a split")
    shape = struct.pack(f"<B{array.ndim}q", array.ndim, *array.shape)
    return prefix + shape + np.ascontiguousarray(data).tobytes()


class _InPseudorandomSplit(Predicate):
    def __init__(
        self, fractions: Sequence[float], subset_index: int, field: str, seed: int = 0
    ) -> None:
        if isinstance(fractions, (str, bytes)) or not isinstance(fractions, Iterable):
            raise ValueError(
                f"in_pseudorandom_split: fractions must be a list of numbers, got {fractions!r}"
            )
        fracs = list(fractions)
        if not fracs:
            raise ValueError("in_pseudorandom_split: fractions must not be empty, got []")
        for f in fracs:
            if (
                isinstance(f, (bool, np.bool_))
                or not isinstance(f, numbers.Real)
                or not math.isfinite(f)
                or f < 0
            ):
                raise ValueError(
                    f"in_pseudorandom_split: each fraction must be a finite number >= 0, "
                    f"got {f!r} in {fracs!r}"
                )
        total = math.fsum(fracs)
        if total > 1 + 1e-9:
            raise ValueError(
                f"in_pseudorandom_split: fractions must sum to at most 1, got {fracs!r} "
                f"(sum {total!r})"
            )
        self.fractions = tuple(float(f) for f in fracs)
        self.subset_index = check_int(
            "in_pseudorandom_split: subset_index", subset_index, 0, len(fracs) - 1
        )
        self.field = _check_field_name("in_pseudorandom_split: field", field)
        self.seed = check_int("in_pseudorandom_split: seed", seed, 0)
        # Integer bounds on the top 53 bits of the hash: the same exact comparison for one value
        # and for a vectorized batch. Fractions summing to 1 up to rounding cover everything.
        cumulative = [math.fsum(self.fractions[: i + 1]) for i in range(len(fracs))]
        bounds = [min(round(c * _U53), _U53) for c in cumulative]
        if total >= 1 - 1e-9:
            bounds[-1] = _U53
        i = self.subset_index
        self._low = bounds[i - 1] if i else 0
        self._high = bounds[i]
        # Decimal text hashes any size of seed the same way in every process.
        digest = hashlib.blake2b(
            str(self.seed).encode("ascii"), digest_size=32, person=b"ydl-split-v1"
        ).digest()
        self._int_key = int.from_bytes(digest[0:8], "little")
        self._float_key = int.from_bytes(digest[8:16], "little")
        self._blake_key = digest[16:32]

    def get_fields(self) -> frozenset[str]:
        return frozenset((self.field,))

    def _blake(self, data: bytes) -> int:
        h = hashlib.blake2b(data, digest_size=8, key=self._blake_key)
        return int.from_bytes(h.digest(), "little")

    def _hash(self, value: Any) -> int:
        """The 64-bit keyed hash of one value; ``_hash_column`` is its vectorized twin."""
        if isinstance(value, (bool, int, np.bool_, np.integer)) and not isinstance(
            value, np.timedelta64
        ):
            number = int(value)
            if _INT64_MIN <= number <= MASK64:
                return splitmix64((number & MASK64) ^ self._int_key)
            return self._blake(b"I" + str(number).encode("ascii"))
        if isinstance(value, (float, np.floating)):
            return splitmix64(_float_bits(float(value)) ^ self._float_key)
        if isinstance(value, str):
            return self._blake(b"s" + value.encode("utf-8", "surrogatepass"))
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self._blake(b"b" + bytes(value))
        if value is None:
            return self._blake(b"n")
        if isinstance(value, (np.ndarray, np.generic, complex)):
            array = np.asarray(value)
            if array.ndim == 0 and array.dtype.kind in "biuf":
                return self._hash(array[()])
            return self._blake(b"a" + _canonical_array_bytes(array))
        raise TypeError(
            f"{self!r}: cannot hash {value!r} of type {type(value).__name__}; split on a "
            "numeric, str or bytes field"
        )

    def _hash_column(self, column: Any, n: int) -> npt.NDArray[np.uint64]:
        if isinstance(column, np.ndarray) and column.ndim == 1:
            kind = column.dtype.kind
            if kind in "bu":
                return splitmix64_array(column.astype(np.uint64) ^ np.uint64(self._int_key))
            if kind == "i":
                bits = column.astype(np.int64).view(np.uint64)
                return splitmix64_array(bits ^ np.uint64(self._int_key))
            if kind == "f":
                floats = column.astype(np.float64) + 0.0
                bits = floats.view(np.uint64).copy()
                bits[np.isnan(floats)] = _CANONICAL_NAN
                return splitmix64_array(bits ^ np.uint64(self._float_key))
        return np.fromiter((self._hash(v) for v in column), dtype=np.uint64, count=n)

    def include(self, values: Mapping[str, Any]) -> bool:
        position = self._hash(_get_value(values, self.field, self)) >> 11
        return self._low <= position < self._high

    def include_batch(self, columns: Mapping[str, Any], n: int) -> Mask:
        column = _get_column(columns, self.field, n, self)
        positions = self._hash_column(column, n) >> np.uint64(11)
        return (positions >= np.uint64(self._low)) & (positions < np.uint64(self._high))

    def __repr__(self) -> str:
        return (
            f"in_pseudorandom_split({list(self.fractions)!r}, {self.subset_index}, "
            f"{self.field!r}, seed={self.seed})"
        )


def in_set(field: str, values: Iterable[Any]) -> Predicate:
    """Keeps records whose scalar ``field`` equals one of ``values`` (Python ``==``: 2 matches
    2.0, 2.5 matches no int, NaN matches nothing; a None in values matches nulls)."""
    return _InSet(field, values)


def in_lambda(
    fields: Sequence[str] | str, func: Callable[..., Any], vectorized: bool = False
) -> Predicate:
    """Keeps records for which ``func(*values)`` is True, values in the order of ``fields``.

    With ``vectorized=True``, ``func(*columns)`` decides a whole batch at once and must return a
    bool array of one entry per record (columns as ``DataRef.get_batch`` gives them).
    """
    return _InLambda(fields, func, vectorized)


def in_intersection(field: str, values: Iterable[Any]) -> Predicate:
    """Keeps records where any element of the array ``field`` is one of ``values``."""
    return _InIntersection(field, values)


def in_negate(pred: Predicate) -> Predicate:
    """Keeps the records that ``pred`` rejects."""
    return _InNegate(pred)


def in_reduce(preds: Iterable[Predicate], reduce_func: Callable[..., bool]) -> Predicate:
    """Keeps records accepted by all (``reduce_func=all``) or any (``any``) of ``preds``."""
    return _InReduce(preds, reduce_func)


def in_pseudorandom_split(
    fractions: Sequence[float], subset_index: int, field: str, seed: int = 0
) -> Predicate:
    """Keeps subset ``subset_index`` of a deterministic split of the records by ``field``.

    A keyed hash maps each value to u in [0, 1); subset i holds the values with
    ``sum(fractions[:i]) <= u < sum(fractions[:i+1])``, so each subset holds its fraction of
    the distinct values, up to sampling error. Fractions may sum to less than 1: the rest is in
    no subset. Equal values land in the same subset, in every process and Python run; another
    ``seed`` gives an independent split. Integers hash alike whatever their dtype; a float
    hashes differently from the equal integer.
    """
    return _InPseudorandomSplit(fractions, subset_index, field, seed)
