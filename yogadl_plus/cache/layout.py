"""How one record's fields sit in one LMDB value, so that any subset can be read alone.

A record value is::

    [null bitmap][fixed region][uint32 end offsets of the variable fields][variable payloads]

- the null bitmap has one bit per nullable field (absent when no field is nullable);
- the fixed region holds the fields whose every value has the same size (fixed-shape Raw and
  Scalar, not nullable) at offsets known from the schema alone, so a batch of records is decoded
  with one ``np.frombuffer`` over a structured dtype, and one record with no parsing at all;
- the variable fields (strings, bytes, variable shapes, compressed, images, nullable) follow,
  located by a small table of end offsets.

Reading a field slices the LMDB memoryview at its offsets: other fields are never decoded and, for
large values that span overflow pages, never touched.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from yogadl_plus import codecs
from yogadl_plus.cache.fixed import Allocate, FieldSpans, FixedColumns, Values
from yogadl_plus.cache.recycle import ArrayRecycler
from yogadl_plus.cache.tokencolumns import TokenBatch, token_fields
from yogadl_plus.errors import SchemaError
from yogadl_plus.schema import Field, Schema

__all__ = ["MAX_RECORD_BYTES", "RecordLayout"]

_U32 = struct.Struct("<I")
# Records of fixed fields only, at most this big, are read as rows gathered from the chunk files
# (cache/pagemap.py): a get per record is then most of a batch's time. Bigger ones cost their
# copy, not their get.
_GATHERED_RECORD_BYTES = 4096
#: The most bytes one record's value may take: LMDB refuses larger values (MDB_MAXDATASIZE), and
#: the layout's uint32 end offsets could not point past it.
MAX_RECORD_BYTES = 2**32 - 1
_TOO_LARGE_FIX = (
    "split the value across records or fields, or store it elsewhere (a file or object store) "
    "and cache a reference to it (its path or URL)"
)


class RecordLayout:
    """Packs validated records into bytes and reads fields back, one record or a batch."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.nullable = [f for f in schema if f.nullable]
        self.null_bit = {f.name: i for i, f in enumerate(self.nullable)}
        self.bitmap_bytes = (len(self.nullable) + 7) // 8
        self.fixed = [f for f in schema if f.fixed]
        # Small scalars are also kept as whole-chunk columns, so filters and timestamp scans
        # over them need no per-record reads.
        self.column_fields = tuple(f for f in self.fixed if f.shape == ())
        #: The fields every chunk also keeps as a token column (cache/tokencolumns.py): 1-D
        #: integer arrays, fixed or variable in length, nullable or not.
        self.token_fields = token_fields(schema)
        self.variable = [f for f in schema if not f.fixed]
        self.offset: dict[str, int] = {}
        position = self.bitmap_bytes
        for f in self.fixed:
            self.offset[f.name] = position
            position += f.nbytes
        self.fixed_end = position
        self.var_index = {f.name: i for i, f in enumerate(self.variable)}
        self.var_table = struct.Struct(f"<{len(self.variable)}I") if self.variable else None
        self.payload_start = self.fixed_end + 4 * len(self.variable)
        if self.payload_start > MAX_RECORD_BYTES:
            sizes = ", ".join(f"{f.name!r} {f.nbytes}" for f in self.fixed)
            raise SchemaError(
                f"the fixed-shape fields take {self.fixed_end} bytes per record ({sizes}), over "
                f"the {MAX_RECORD_BYTES} bytes one record can hold; {_TOO_LARGE_FIX}"
            )
        # The most bytes the variable fields of one record may take together.
        self._payload_limit = MAX_RECORD_BYTES - self.payload_start
        self._names = set(schema.names)
        self._num_fields = len(schema)
        self._encoders = [(f.name, f, self._field_encoder(f)) for f in schema]
        self._fixed_encoders = [(n, e) for n, f, e in self._encoders if f.fixed]
        self._variable_encoders = [(n, e) for n, f, e in self._encoders if not f.fixed]
        self._encoder_of = {n: e for n, _, e in self._encoders}
        self._bitmap_zero = bytes(self.bitmap_bytes)
        self._decoders = {f.name: self._field_decoder(f) for f in schema}
        #: The fields whose stored bytes are an image file (``codecs.Image``): what
        #: ``decode_columns(..., stored=...)`` hands out undecoded where asked.
        self.image_fields = frozenset(f.name for f in schema if isinstance(f.codec, codecs.Image))
        plain = not self.variable and not self.bitmap_bytes
        self._fixed_columns = FixedColumns(self.offset, self.fixed_end, plain)
        #: The size of every record value where batches are read as gathered rows, else 0.
        self.row_bytes = self.fixed_end if plain and self.fixed_end <= _GATHERED_RECORD_BYTES else 0
        # Big batch arrays reuse the memory of those the caller dropped (see cache/recycle.py).
        self.recycler = ArrayRecycler()

    # --- writing ---

    def _field_encoder(self, field: Field) -> Callable[[Any], bytes]:
        """value -> bytes for one field: exact-type values skip the general conversion."""
        codec = field.codec
        assert codec is not None
        convert = field.converter()
        # (A nullable scalar is variable only to hold a None: its value's bytes are as fixed.)
        if field.fixed or isinstance(codec, codecs.Scalar):
            dtype, shape = field.dtype, field.shape
            # A datetime64 or timedelta64 scalar can have any unit: only the converter knows.
            scalar_type = dtype.type if dtype.kind not in "mM" else None

            def encode_fixed(value: Any) -> bytes:
                kind = type(value)
                if kind is np.ndarray and value.dtype == dtype and value.shape == shape:
                    return value.tobytes()
                if kind is scalar_type:
                    return value.tobytes()
                return convert(value).tobytes()

            return encode_fixed

        if isinstance(codec, codecs.Raw):
            limit = self._payload_limit

            def encode_raw(value: Any) -> bytes:
                array = convert(value)
                if array.nbytes > limit:  # refused before its bytes are copied
                    raise SchemaError(
                        f"field {field.name!r}: got {array.dtype}{list(array.shape)}, "
                        f"{array.nbytes} bytes, over the {limit} bytes a record of this schema "
                        f"can give it (one record holds at most {MAX_RECORD_BYTES} bytes); "
                        f"{_TOO_LARGE_FIX}"
                    )
                return codec.encode(field, array)

            return encode_raw

        def encode_variable(value: Any) -> bytes:
            return codec.encode(field, convert(value))

        return encode_variable

    def encode(self, record: Mapping[str, Any], index: int) -> bytes:
        """The bytes of one record, after checking every field; SchemaError names what is wrong."""
        try:
            if len(record) != self._num_fields:
                raise KeyError
            fixed = [encode(record[name]) for name, encode in self._fixed_encoders]
            if not self._variable_encoders:
                return self._bitmap_zero + b"".join(fixed)
            variable = [encode(record[name]) for name, encode in self._variable_encoders]
        except (KeyError, TypeError, ValueError):
            # Rare path (a None, a bad value, a missing field): find the problem and say it.
            return self._encode_checked(record, index)
        return self._pack(0, fixed, variable, index)

    def _encode_checked(self, record: Mapping[str, Any], index: int) -> bytes:
        if not isinstance(record, Mapping):
            raise SchemaError(
                f"record {index}: expected a dict of field name -> value, "
                f"got {type(record).__name__}"
            )
        if len(record) != len(self._names) or not self._names.issuperset(record):
            self._raise_field_mismatch(record, index)
        fixed: list[bytes] = []
        variable: list[bytes] = []
        bitmap = 0
        for name, field, encode in self._encoders:
            value = record[name]
            if value is None:
                if not field.nullable:
                    raise SchemaError(
                        f"record {index}, field {name!r}: got None but the field is not nullable "
                        f"(expected {field.describe()}); declare Field(..., nullable=True)"
                    )
                bitmap |= 1 << self.null_bit[name]
                variable.append(b"")
                continue
            try:
                data = encode(value)
            except (ValueError, TypeError) as exc:
                if isinstance(exc, SchemaError):
                    raise SchemaError(f"record {index}: {exc}") from None
                raise SchemaError(
                    f"record {index}, field {name!r}: expected {field.describe()}, {exc}"
                ) from None
            (fixed if field.fixed else variable).append(data)
        return self._pack(bitmap, fixed, variable, index)

    def _pack(self, bitmap: int, fixed: list[bytes], variable: list[bytes], index: int) -> bytes:
        head = bitmap.to_bytes(self.bitmap_bytes, "little") if self.bitmap_bytes else b""
        if not variable:
            return head + b"".join(fixed)
        ends = []
        end = 0
        for data in variable:
            end += len(data)
            ends.append(end)
        if end > self._payload_limit:
            self._raise_too_large(variable, index)
        table = self.var_table.pack(*ends)  # type: ignore[union-attr]
        return b"".join([head, *fixed, table, *variable])

    def _raise_too_large(self, variable: list[bytes], index: int) -> None:
        total = self.payload_start + sum(len(data) for data in variable)
        sizes = sorted(
            ((len(data), f.name) for f, data in zip(self.variable, variable)),
            key=lambda size_name: -size_name[0],
        )
        named = ", ".join(f"{name!r} {size}" for size, name in sizes if size)
        raise SchemaError(
            f"record {index}: {total} bytes encoded, over the {MAX_RECORD_BYTES} bytes one "
            f"record can hold (field bytes: {named}); {_TOO_LARGE_FIX}"
        )

    def token_batches(self, values: Sequence[bytes]) -> dict[str, TokenBatch]:
        """The tokens of each token field of the encoded records ``values``."""
        return {
            f.name: TokenBatch.of_stored(f, [self.field_bytes(v, f) for v in values])
            for f in self.token_fields
        }

    def field_encoder(self, name: str) -> Callable[[Any], bytes]:
        """value -> bytes of field ``name``, as ``encode`` packs it (a ValueError or
        TypeError for a value it cannot take; None is not a value)."""
        return self._encoder_of[name]

    @property
    def payload_limit(self) -> int:
        """The most bytes the variable fields of one record may take together."""
        return self._payload_limit

    def check_names(self, names: Mapping[str, Any], what: str) -> None:
        """SchemaError unless ``names`` are the schema's fields, naming ``what`` lacks or adds."""
        if len(names) != self._num_fields or not self._names.issuperset(names):
            self._raise_field_mismatch(names, 0, what)

    def raise_too_large(self, variable: list[bytes], index: int) -> None:
        """The SchemaError of record ``index``, whose variable fields encode to ``variable``
        and take more than ``payload_limit`` bytes."""
        self._raise_too_large(variable, index)

    def _raise_field_mismatch(
        self, record: Mapping[str, Any], index: int, what: str | None = None
    ) -> None:
        missing = sorted(self._names.difference(record))
        extra = sorted(str(k) for k in set(record).difference(self._names))
        parts = []
        if missing:
            parts.append(f"missing field(s) {missing}")
        if extra:
            parts.append(f"unexpected field(s) {extra}")
        raise SchemaError(
            f"{what or f'record {index}'}: {' and '.join(parts)}; "
            f"the schema has fields {list(self.schema.names)}"
        )

    # --- reading ---

    def is_null(self, data: memoryview | bytes, field: Field) -> bool:
        bit = self.null_bit.get(field.name)
        return bit is not None and bool(data[bit >> 3] >> (bit & 7) & 1)

    def field_bytes(self, data: memoryview | bytes, field: Field) -> memoryview | bytes:
        """The slice of a record value holding one (variable) field."""
        if field.fixed:
            start = self.offset[field.name]
            return data[start : start + field.nbytes]
        i = self.var_index[field.name]
        begin = _U32.unpack_from(data, self.fixed_end + 4 * (i - 1))[0] if i else 0
        end = _U32.unpack_from(data, self.fixed_end + 4 * i)[0]
        return data[self.payload_start + begin : self.payload_start + end]

    def _field_decoder(self, field: Field) -> Callable[[memoryview | bytes], Any]:
        """data -> value for one field, with its offsets and shapes worked out once."""
        if field.fixed:
            start, stop, dtype, shape = (
                self.offset[field.name],
                self.offset[field.name] + field.nbytes,
                field.dtype,
                field.shape,
            )
            if shape == ():
                return lambda data: np.frombuffer(data, dtype, 1, start)[0]
            # A private copy: the caller may keep the array after the read transaction ends.
            return lambda data: np.frombuffer(bytearray(data[start:stop]), dtype).reshape(shape)
        codec = field.codec
        assert codec is not None

        def decode_variable(data: memoryview | bytes) -> Any:
            if self.is_null(data, field):
                return None
            return codec.decode(field, self.field_bytes(data, field))

        return decode_variable

    def decode_field(self, data: memoryview | bytes, field: Field) -> Any:
        """One field of one record, as the user sees it (None when null)."""
        return self._decoders[field.name](data)

    def decode_record(self, data: memoryview | bytes, fields: Sequence[Field]) -> dict[str, Any]:
        decoders = self._decoders
        return {f.name: decoders[f.name](data) for f in fields}

    def field_spans(self, fields: Sequence[Field]) -> FieldSpans | None:
        """Where ``fields`` lie in each record value, where a batch of them is read by
        gathering each field's bytes from the chunk files straight into its array (records of
        small fixed fields only: ``row_bytes``); else None (read the values and decode them)."""
        return self._fixed_columns.field_spans(fields) if self.row_bytes else None

    def decode_columns(
        self,
        values: Values,
        fields: Sequence[Field],
        allocate: Allocate | None = None,
        stored: Collection[str] = (),
    ) -> dict[str, Any]:
        """Fields of many records: fixed fields stacked in one vectorized step, others in lists.
        Big arrays are made by ``allocate`` (np.empty's contract; a worker process's shared
        ring), by default in memory this layout recycles (cache/recycle.py). The fields named
        in ``stored`` come undecoded: a list of each record's stored bytes (the codec's
        payload; for an image, its file), None where null."""
        out: dict[str, Any] = {}
        fixed = tuple(f for f in fields if f.fixed and (not stored or f.name not in stored))
        if fixed:
            out.update(self._fixed_columns.decode(values, fixed, allocate or self.recycler.empty))
        for f in fields:
            if f.name in out:
                continue
            if stored and f.name in stored:
                out[f.name] = [self._stored_bytes(v, f) for v in values]
            else:
                decode = self._decoders[f.name]
                out[f.name] = [decode(v) for v in values]
        return {f.name: out[f.name] for f in fields}

    def _stored_bytes(self, data: memoryview | bytes, field: Field) -> bytes | None:
        """One record's stored bytes of ``field`` (a copy: they outlive the read), or None."""
        return None if self.is_null(data, field) else bytes(self.field_bytes(data, field))
