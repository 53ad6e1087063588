"""Columns of records: many records as field -> stacked array (or list), and back.

What DataRef.get_batch, a mixture's batches, the stream's blocks and the framework faces share:
records as dicts from columns (``records``), items stacked into a batch (``collate``), the
columns of several sources put in their places (``merge_columns``), what decides whether two
sources' fields stack together (``stacking``), and the bytes of a block's columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from yogadl_plus.errors import SchemaError

if TYPE_CHECKING:
    from yogadl_plus.schema import Field

__all__ = ["collate", "columns_nbytes", "merge_columns", "records", "stacking"]


def stacking(field: Field) -> tuple[Any, ...]:
    """What decides how a field's values stack in a batch: fields alike in this are batched
    together from different sources."""
    return (field.kind, field.dtype_name, field.shape, field.nullable)


def columns_nbytes(columns: Mapping[Any, Any]) -> int:
    """The bytes of a block's decoded values: arrays, lists of arrays (variable shapes), of
    str (their length) and bytes, and nested columns (n-gram windows)."""
    total = 0
    for column in columns.values():
        if isinstance(column, np.ndarray):
            total += column.nbytes
        elif isinstance(column, Mapping):
            total += columns_nbytes(column)
        elif isinstance(column, list):
            # (A nullable field's missing values are None: they hold no bytes.)
            total += sum(
                value.nbytes if isinstance(value, np.ndarray) else len(value)
                for value in column
                if isinstance(value, (np.ndarray, str, bytes))
            )
    return total


def merge_columns(
    parts: Sequence[tuple[str, np.ndarray, Mapping[str, Any]]], n: int
) -> dict[str, Any]:
    """Columns of ``n`` items from parts (source name, the items' places, their columns):
    each field's arrays (or lists) put in place. A field that some part lacks, or that comes
    as arrays of different shapes or types, is a SchemaError naming it and the sources."""
    first_name, _, first = parts[0]
    out: dict[str, Any] = {}
    for field, column in first.items():
        stacked = isinstance(column, np.ndarray)
        if stacked:
            merged: Any = np.empty((n, *column.shape[1:]), dtype=column.dtype)
        else:
            merged = [None] * n
        for name, where, columns in parts:
            part = columns.get(field)
            if part is None and field not in columns:
                raise SchemaError(
                    f"field {field!r} is in source {first_name!r} but not in source {name!r}"
                )
            if stacked:
                if (
                    not isinstance(part, np.ndarray)
                    or part.shape[1:] != column.shape[1:]
                    or (part.dtype != column.dtype)
                ):
                    raise SchemaError(
                        f"field {field!r} differs between sources {first_name!r} and {name!r}: "
                        "batches of a mixture need it alike in every source"
                    )
                merged[where] = part
            else:
                for place, value in zip(where.tolist(), list(part or ())):
                    merged[place] = value
        out[field] = merged
    return out


def records(columns: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """``n`` records as dicts, from columns (arrays or lists) as decode_columns gives them."""
    names = list(columns)
    values = [list(c) if isinstance(c, np.ndarray) else c for c in columns.values()]
    return [dict(zip(names, row)) for row in zip(*values)] if names else [{} for _ in range(n)]


def collate(items: list[Any]) -> Any:
    """Stack items into a batch: dicts field by field (nested dicts too), equal-shape arrays and
    numbers into arrays, anything else (None among them) into lists."""
    first = items[0]
    if isinstance(first, dict):
        return {key: collate([item[key] for item in items]) for key in first}
    numeric = isinstance(first, (np.ndarray, np.generic, int, float)) and not isinstance(
        first,
        (str, bytes),  # np.str_ and np.bytes_ are np.generic too
    )
    if numeric:
        shapes = {np.shape(v) for v in items}
        # (A nullable field's None has shape (): among scalars only, it needs looking for.)
        if len(shapes) == 1 and (shapes != {()} or not any(v is None for v in items)):
            return np.stack([np.asarray(v) for v in items])
    return list(items)
