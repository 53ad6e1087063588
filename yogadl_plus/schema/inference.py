"""The schema a source's first records imply: what each value holds, and the field that holds
them all (dims that differ become None, dtypes are promoted only where no value changes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from yogadl_plus.errors import SchemaError
from yogadl_plus.schema.model import Field, Schema
from yogadl_plus.schema.values import (
    RAGGED_FIX,
    describe_value,
    first_non_number,
    holds_none,
    null_inside,
    where_ragged,
)

__all__ = ["infer_field", "infer_schema", "infer_value"]


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
            if holds_none(value):
                raise SchemaError(f"{where}: {null_inside(value)}") from None
            ragged = where_ragged(value)
            if ragged is not None:
                raise SchemaError(
                    f"{where}: cannot infer a field from a ragged nested list: {ragged}; "
                    f"{RAGGED_FIX}"
                ) from None
            raise SchemaError(
                f"{where}: cannot infer a field from {describe_value(value)} ({exc}); "
                "pass schema= to cache_dataset"
            ) from None
        else:
            if array.dtype.kind in "biufcmM":
                return "numeric", array.dtype, array.shape
            if array.dtype.kind in "US" and array.ndim == 0:
                return ("str" if array.dtype.kind == "U" else "bytes"), None, ()
            if holds_none(value):
                raise SchemaError(f"{where}: {null_inside(value)}")
    if isinstance(value, Mapping):
        raise SchemaError(
            f"{where}: cannot infer a field from a dict (keys {sorted(map(str, value))[:8]}); "
            "a field holds one array, not a nested record: make each key a field of its own"
        )
    what = describe_value(value)
    if isinstance(value, (list, tuple)) or (
        isinstance(value, np.ndarray) and value.dtype == object
    ):
        odd = first_non_number(value)
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
