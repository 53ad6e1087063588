"""Fixed-shape fields of many records, decoded into stacked arrays in one vectorized step.

The fixed region of every record value has the same layout (cache/layout.py), so the selected
fields of a batch come out of one join of the records' bytes viewed with a structured dtype, or,
for large values, of one copy per field straight into its array.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from yogadl_plus.cache.rowcopy import copy_rows
from yogadl_plus.errors import CacheCorrupted
from yogadl_plus.schema import Field

__all__ = ["Allocate", "FieldSpans", "FixedColumns", "Values"]

# np.empty's contract: where big decoded arrays are made.
Allocate = Callable[[tuple[int, ...], Any], np.ndarray]
#: Record values as read: views into a chunk's map (valid in the reading thread until its next
#: read), or, for records of fixed fields only, the rows of a uint8 array gathered from the
#: chunks (cache/pagemap.py), one record a row.
Values = Sequence[memoryview | bytes] | np.ndarray

# Unselected bytes a bulk copy may carry along before per-field copies become cheaper.
_SPAN_SLACK_BYTES = 4096
# Many bytes of one field are copied into an array numpy allocates (which asks the kernel for
# huge pages) instead of joined into a bytearray: past glibc's 32 MiB mmap threshold, every
# join gets fresh 4 KiB pages, a page fault each.
_GATHER_INTO_ARRAY_BYTES = 1 << 20
# Records whose selected span is at least this big are copied field by field straight into
# each field's array: one copy of their bytes instead of two (a structured copy and a split),
# while the slicing that costs per record stays small next to the bytes.
_SPLIT_RECORD_BYTES = 4096


def _struct_dtype(fields: Sequence[Field], offsets: list[int], itemsize: int) -> np.dtype:
    """A structured dtype viewing fixed fields at ``offsets`` of ``itemsize``-byte records."""
    spec: Any = {
        "names": [f.name for f in fields],
        "formats": [(f.dtype, f.shape) if f.shape else f.dtype for f in fields],
        "offsets": offsets,
        "itemsize": itemsize,
    }
    return np.dtype(spec)


def _stacked(n: int, field: Field) -> tuple[int, ...]:
    """The shape of ``n`` values of a fixed-shape field stacked together."""
    return (n, *(int(d) for d in field.shape if d is not None))


@dataclass(frozen=True)
class FieldSpans:
    """Where fixed fields lie in every record value, for reads that gather each field's bytes
    straight into its own array: per field its name, ``(start, width)`` in the value, the dtype
    and per-record shape its bytes are viewed as, and whether it is read from the chunks'
    whole-chunk columns instead (``whole``: a contiguous array gathers faster)."""

    names: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    dtypes: tuple[np.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]
    whole: tuple[bool, ...]

    @functools.cached_property
    def value_spans(self) -> tuple[tuple[int, int], ...]:
        """The spans gathered from the record values (the fields not read ``whole``)."""
        return tuple(span for span, whole in zip(self.spans, self.whole) if not whole)

    def reading_whole(self, columns: Collection[str]) -> FieldSpans:
        """These spans with the fields named in ``columns`` read from whole-chunk columns."""
        return replace(self, whole=tuple(name in columns for name in self.names))

    def arrays(
        self, gathered: Sequence[np.ndarray], column: Callable[[str, np.dtype], np.ndarray]
    ) -> dict[str, np.ndarray]:
        """The fields' arrays, in order: from their gathered bytes (one item of ``width``
        bytes per record, in the order of ``value_spans``) viewed in place, or ``column(name,
        dtype)`` for those read whole."""
        out = {}
        values = iter(gathered)
        for name, dtype, shape, whole in zip(self.names, self.dtypes, self.shapes, self.whole):
            if whole:
                out[name] = column(name, dtype)
            else:
                items = next(values)
                out[name] = items.view(dtype).reshape(len(items), *shape)
        return out


class FixedColumns:
    """Decodes fixed fields at ``offsets`` of records whose fixed region ends at ``fixed_end``;
    ``plain``: records hold the fixed region only (no null bitmap, no variable fields)."""

    def __init__(self, offsets: dict[str, int], fixed_end: int, plain: bool) -> None:
        self.offset = offsets
        self.fixed_end = fixed_end
        self.plain = plain
        self._plans: dict[tuple[Field, ...], tuple[int, int, np.dtype | None, bool]] = {}

    def field_spans(self, fields: Sequence[Field]) -> FieldSpans | None:
        """Where ``fields`` lie in each record value, or None where one is not a fixed field
        of this layout or takes no bytes."""
        if not fields or any(f.name not in self.offset or not f.nbytes for f in fields):
            return None
        return FieldSpans(
            tuple(f.name for f in fields),
            tuple((self.offset[f.name], f.nbytes) for f in fields),
            tuple(f.dtype for f in fields),
            tuple(_stacked(0, f)[1:] for f in fields),
            (False,) * len(fields),
        )

    def _plan(self, fields: tuple[Field, ...]) -> tuple[int, int, np.dtype | None, bool]:
        """(lo, hi, struct dtype, whole) for bulk-decoding ``fields``; dtype None means one copy
        per field (large unselected fixed fields lie between the selected ones)."""
        plan = self._plans.get(fields)
        if plan is None:
            lo = min(self.offset[f.name] for f in fields)
            hi = max(self.offset[f.name] + f.nbytes for f in fields)
            selected = sum(f.nbytes for f in fields)
            one_field = len(fields) == 1 and hi - lo == selected
            if (hi - lo) - selected > max(_SPAN_SLACK_BYTES, selected) or (
                hi - lo >= _SPLIT_RECORD_BYTES and not one_field
            ):
                plan = (lo, hi, None, False)
            else:
                whole = lo == 0 and hi == self.fixed_end and self.plain
                offsets = [self.offset[f.name] - lo for f in fields]
                plan = (lo, hi, _struct_dtype(fields, offsets, hi - lo), whole)
            self._plans[fields] = plan
        return plan

    def decode(
        self, values: Values, fields: tuple[Field, ...], allocate: Allocate
    ) -> dict[str, np.ndarray]:
        n = len(values)
        lo, hi, dtype, whole = self._plan(fields)
        if dtype is None or (
            len(fields) == 1
            and hi - lo == fields[0].nbytes
            and n * (hi - lo) >= _GATHER_INTO_ARRAY_BYTES
        ):
            return {f.name: self._one(values, f, allocate) for f in fields}
        if isinstance(values, np.ndarray):
            return self._from_rows(values, fields, lo, hi, dtype)
        # A record that is all selected fixed fields is copied as is, without slicing.
        buffer = bytearray().join(values if whole else [v[lo:hi] for v in values])
        if len(buffer) != n * (hi - lo):
            raise CacheCorrupted(
                f"record sizes do not match the stored schema's layout ({len(buffer)} bytes for "
                f"{n} records of {hi - lo}); run storage.verify() and rebuild the version"
            )
        if len(fields) == 1 and hi - lo == fields[0].nbytes:
            # The record region is exactly this field: reinterpret, no copy.
            f = fields[0]
            return {f.name: np.frombuffer(buffer, f.dtype).reshape(_stacked(n, f))}
        rows = np.frombuffer(buffer, dtype, n)
        return {f.name: np.ascontiguousarray(rows[f.name]) for f in fields}

    def _from_rows(
        self, rows: np.ndarray, fields: tuple[Field, ...], lo: int, hi: int, dtype: np.dtype
    ) -> dict[str, np.ndarray]:
        """``decode`` of gathered rows (whole records of fixed fields only, one a row)."""
        n = len(rows)
        span = rows if lo == 0 and hi == rows.shape[1] else np.ascontiguousarray(rows[:, lo:hi])
        if len(fields) == 1 and hi - lo == fields[0].nbytes:
            f = fields[0]
            return {f.name: span.view(f.dtype).reshape(_stacked(n, f))}
        structured = span.view(dtype).reshape(n)
        return {f.name: np.ascontiguousarray(structured[f.name]) for f in fields}

    def _one(self, values: Values, f: Field, allocate: Allocate) -> np.ndarray:
        start, stop = self.offset[f.name], self.offset[f.name] + f.nbytes
        n = len(values)
        if isinstance(values, np.ndarray):  # (gathered rows: sizes right by construction)
            out = allocate(_stacked(n, f), f.dtype)
            if n:
                out.reshape(n, -1).view(np.uint8)[...] = values[:, start:stop]
            return out
        if n * f.nbytes < _GATHER_INTO_ARRAY_BYTES:
            buffer = bytearray().join([v[start:stop] for v in values])
            if len(buffer) != n * f.nbytes:
                raise CacheCorrupted(
                    f"field {f.name!r}: record sizes do not match the stored schema"
                )
            return np.frombuffer(buffer, f.dtype).reshape(_stacked(n, f))
        # Records of fixed fields only all have one size: a longer one is as wrong as a short one.
        lengths = np.fromiter(map(len, values), np.int64, n)
        wrong = lengths != self.fixed_end if self.plain else lengths < stop
        if wrong.any():
            raise CacheCorrupted(
                f"field {f.name!r}: a record of {int(lengths[wrong.argmax()])} bytes does not "
                "match the stored schema's layout; run storage.verify() and rebuild the version"
            )
        out = allocate(_stacked(n, f), f.dtype)
        copy_rows(out.reshape(n, -1).view(np.uint8), values, start, stop)
        return out
