"""Encoding a batch of records given as columns, a column at a time, into exactly the bytes
``RecordLayout.encode`` gives each record.

The fixed region of every record is filled column by column in one array (a cast where the
column's dtype differs, checked as a record's value would be); records with fixed fields only
are then one buffer, cut into values as LMDB takes them (``EqualValues``). Variable fields are
encoded value by value, their end offsets and null bits computed for the whole batch at once.
The token fields' tokens (cache/tokencolumns.py) come from the same arrays and encoded values:
a fixed one's are its column's array, a variable one's cut from its encoded values at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from yogadl_plus.cache.layout import RecordLayout
from yogadl_plus.cache.tokencolumns import TokenBatch, is_token_field
from yogadl_plus.cache.writer import EqualValues
from yogadl_plus.errors import SchemaError
from yogadl_plus.schema import Field, cast_exactly

__all__ = ["BatchEncoder"]


class BatchEncoder:
    """``encode(columns, rows, first)``: the values of a batch of records of ``layout``."""

    def __init__(self, layout: RecordLayout) -> None:
        self.layout = layout

    def encode(
        self, columns: Mapping[str, Any], rows: int, first: int
    ) -> tuple[list[bytes] | EqualValues, dict[str, np.ndarray], dict[str, TokenBatch]]:
        """The bytes of ``rows`` records given as columns (field name -> an array of the rows,
        shape ``(rows, *field.shape)``, or a sequence of one value per row, None for a null),
        records ``first`` .. on; the whole-chunk columns (``column_fields``) as arrays; and
        the token fields' tokens (``token_fields``). SchemaError names the column, or the
        record and field, that is wrong."""
        layout = self.layout
        layout.check_names(columns, "the columns")
        if not rows:  # (a batch of no rows, as a Parquet file without any gives)
            return [], {}, {}
        heads = np.zeros((rows, layout.payload_start), np.uint8)
        packed: dict[str, np.ndarray] = {}
        for f in layout.fixed:
            array = self._fixed_column(f, columns[f.name], rows, first)
            start = layout.offset[f.name]
            heads[:, start : start + f.nbytes] = array.reshape(rows, -1).view(np.uint8)
            packed[f.name] = array
        chunk_columns = {f.name: packed[f.name] for f in layout.column_fields}
        tokens = {
            f.name: TokenBatch(np.full(rows, f.shape[0], np.int64), packed[f.name].reshape(-1))
            for f in layout.token_fields
            if f.name in packed
        }
        if not layout.variable and not layout.bitmap_bytes:
            if not layout.payload_start:  # (fields of no bytes at all)
                return [b""] * rows, chunk_columns, tokens
            return EqualValues(heads.tobytes(), layout.payload_start), chunk_columns, tokens
        return self._with_variable(columns, heads, rows, first, tokens), chunk_columns, tokens

    def _with_variable(
        self,
        columns: Mapping[str, Any],
        heads: np.ndarray,
        rows: int,
        first: int,
        tokens: dict[str, TokenBatch],
    ) -> list[bytes]:
        """Each record: its head (null bits, fixed region, then the end offsets of its
        variable fields, filled in here) and its variable payloads. The variable token
        fields' tokens go into ``tokens``."""
        layout = self.layout
        payloads = []
        for f in layout.variable:
            values, nulls = self._variable_column(f, columns[f.name], rows, first)
            payloads.append(values)
            if is_token_field(f):
                tokens[f.name] = TokenBatch.of_stored(f, values)
            if nulls is not None:
                bit = layout.null_bit[f.name]
                heads[:, bit >> 3] |= nulls.astype(np.uint8) << (bit & 7)
        lengths = np.array([list(map(len, values)) for values in payloads], np.int64)
        ends = np.cumsum(lengths.T.reshape(rows, -1), axis=1)
        too_large = np.flatnonzero(ends[:, -1] > layout.payload_limit)
        if too_large.size:
            row = int(too_large[0])
            layout.raise_too_large([values[row] for values in payloads], first + row)
        heads[:, layout.fixed_end :].view("<u4")[:] = ends
        data = heads.tobytes()
        width = layout.payload_start
        return [
            b"".join((data[i * width : (i + 1) * width], *parts))
            for i, parts in enumerate(zip(*payloads))
        ]

    def _fixed_column(self, field: Field, data: Any, rows: int, first: int) -> np.ndarray:
        """A fixed field's column as a C-contiguous array of its dtype, shape (rows, *shape):
        an array of numbers cast exactly (as one record's value would be), other sequences
        converted value by value."""
        shape = cast(tuple[int, ...], field.shape)  # (a fixed field's dims are all known)
        want = (rows, *shape)
        if isinstance(data, np.ndarray) and data.dtype.kind in "biufcmM":
            if data.shape != want:
                raise SchemaError(
                    f"column {field.name!r}: got an array of shape {data.shape} for {rows} "
                    f"records of {field.describe()}: expected shape {want}"
                )
            if data.dtype != field.dtype:
                try:
                    data = cast_exactly(data, field.dtype)
                except ValueError as exc:
                    raise SchemaError(
                        f"column {field.name!r}: expected {field.describe()}, {exc}"
                    ) from None
            return np.ascontiguousarray(data)
        out = np.empty(want, field.dtype)
        encode = self.layout.field_encoder(field.name)
        for i, value in enumerate(_sized(field, data, rows)):
            # (The record's own encoder says what is wrong, in the record's words.)
            encoded = _encoded(field, encode, value, first + i)
            out[i] = np.frombuffer(encoded, field.dtype).reshape(shape)
        return out

    def _variable_column(
        self, field: Field, data: Any, rows: int, first: int
    ) -> tuple[list[bytes], np.ndarray | None]:
        """A variable field's encoded values, b"" for a null, and which rows are null (None:
        none is)."""
        values = _sized(field, data, rows)
        encode = self.layout.field_encoder(field.name)
        nulls = None
        if field.nullable:
            nulls = np.fromiter((v is None for v in values), bool, rows)
            if not nulls.any():
                nulls = None
        try:
            if nulls is None:
                return list(map(encode, values)), None
            return [b"" if v is None else encode(v) for v in values], nulls
        except (KeyError, TypeError, ValueError):
            # Rare path: find the value that is wrong and say so.
            for i, value in enumerate(values):
                if value is not None or not field.nullable:
                    _encoded(field, encode, value, first + i)
            raise


def _sized(field: Field, data: Any, rows: int) -> Sequence[Any]:
    """``data`` as the column's ``rows`` values, or a SchemaError naming the column."""
    if (isinstance(data, np.ndarray) and data.ndim == 0) or not hasattr(data, "__len__"):
        raise SchemaError(
            f"column {field.name!r}: expected one value per record, got {type(data).__name__}"
        )
    if len(data) != rows:
        raise SchemaError(f"column {field.name!r}: {len(data)} values for {rows} records")
    return cast(Sequence[Any], data)


def _encoded(field: Field, encode: Callable[[Any], bytes], value: Any, index: int) -> bytes:
    """One value of ``field`` encoded, or the SchemaError a record's would raise."""
    if value is None:
        raise SchemaError(
            f"record {index}, field {field.name!r}: got None but the field is not nullable "
            f"(expected {field.describe()}); declare Field(..., nullable=True)"
        )
    try:
        return encode(value)
    except SchemaError as exc:
        raise SchemaError(f"record {index}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise SchemaError(
            f"record {index}, field {field.name!r}: expected {field.describe()}, {exc}"
        ) from None
