"""NGram: windows of consecutive records whose timestamps lie close together.

A window anchored at record ``k`` holds records ``k + min_offset .. k + max_offset`` in storage
order, and yields an entry for each (an empty one for an offset not named, as Petastorm's do).
Which windows exist is a pure function of the timestamps, computed once per DataRef as a
sorted array of anchors; the Stream then shuffles, shards and resumes positions in that array
exactly as it does record indices. Field names may be regular expressions, matched against the
dataset's schema when a stream is made (``Schema.matching``).

This module holds the settings (what a window is, checked once, matched against a schema); the
windows are read from a DataRef by ``yogadl_plus.stream.ngram_reader``, which also keeps the
anchors each DataRef has.
"""

from __future__ import annotations

import datetime
import decimal
import math
import numbers
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from yogadl_plus.checks import check_bool
from yogadl_plus.errors import NGramError, SchemaError

if TYPE_CHECKING:
    from yogadl_plus.cache.fixed import Allocate
    from yogadl_plus.schema import Field, Schema
    from yogadl_plus.streamsource import LeafSource

__all__ = ["NGram", "NGramError"]

# Offsets far beyond any dataset, small enough that anchor + offset never overflows int64.
_MAX_OFFSET = 2**62
# Records a window may span: it yields an entry for each (a dict, even where empty).
_MAX_SPAN = 1 << 16
# Units without a fixed length cannot bound a gap between two instants.
_UNFIXED_UNITS = ("generic", "Y", "M")


def _check_offset(key: object) -> int:
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer)):
        raise ValueError(
            f"NGram fields keys are int offsets, got {key!r} of type {type(key).__name__}"
        )
    offset = int(key)
    if not -_MAX_OFFSET <= offset <= _MAX_OFFSET:
        raise ValueError(f"NGram offset must be in [-2**62, 2**62], got {offset}")
    return offset


def _check_names(offset: int, names: object) -> tuple[str, ...]:
    if not isinstance(names, (list, tuple)) or not names:
        raise ValueError(
            f"NGram fields[{offset}] must be a non-empty list of field names (or regular "
            f"expressions), got {names!r}"
        )
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"NGram fields[{offset}] holds field names or regular expressions (non-empty "
                f"str), got {name!r} in {names!r}"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"NGram fields[{offset}] names a field twice: {names!r}")
    return tuple(names)


def _check_span(offsets: tuple[int, ...]) -> int:
    span = offsets[-1] - offsets[0] + 1
    if span > _MAX_SPAN:
        raise ValueError(
            f"NGram offsets {offsets[0]} .. {offsets[-1]} span {span} records: a window yields "
            f"an entry for each offset of its span (an empty dict for those not named), so it "
            f"may span at most {_MAX_SPAN}"
        )
    return span


def _matched(schema: Schema, name: str, what: str) -> tuple[str, ...]:
    """The fields ``name`` stands for in ``schema`` (``Schema.matching``); SchemaError naming
    ``what`` it is when none."""
    try:
        found = schema.matching(name)
    except re.error as exc:
        raise SchemaError(
            f"NGram {what} {name!r} is neither a field of the dataset nor a regular expression "
            f"({exc}); the schema has {list(schema.names)}"
        ) from None
    if not found:
        raise SchemaError(
            f"NGram {what} {name!r} is not in the dataset, nor does it match a field name as a "
            f"regular expression; the schema has {list(schema.names)}"
        )
    return found


def _check_delta(value: object) -> int | float | np.timedelta64:
    """The threshold as int, float, or a np.timedelta64 with a fixed unit, or ValueError."""
    if isinstance(value, datetime.timedelta):
        value = np.timedelta64(value)
    if isinstance(value, np.timedelta64):
        unit = np.datetime_data(value.dtype)[0]
        if unit in _UNFIXED_UNITS:
            raise ValueError(
                f"delta_threshold {value!r} needs a fixed unit (s, ms, us, ns, m, h, D, W), "
                f"not {unit!r}: e.g. np.timedelta64(5, 's')"
            )
        if np.isnat(value) or int(value.astype(np.int64)) < 0:
            raise ValueError(f"delta_threshold must be >= 0, got {value!r}")
        return value
    if isinstance(value, decimal.Decimal):  # (a real number, which numbers.Real leaves out)
        value = float(value)
    if isinstance(value, (bool, np.bool_, np.datetime64)) or not isinstance(value, numbers.Real):
        raise ValueError(
            "delta_threshold must be a real number >= 0 (or a np.timedelta64 for datetime64 "
            f"timestamps), got {value!r} of type {type(value).__name__}"
        )
    number: int | float = int(value) if isinstance(value, numbers.Integral) else float(value)
    if math.isnan(number) or number < 0:
        raise ValueError(f"delta_threshold must be >= 0, got {value!r}")
    return number


class NGram:
    """Windows ``{offset: {field: value}}`` of records whose consecutive timestamps differ by at
    most ``delta_threshold``.

    ``fields`` maps int offsets (negative and gaps allowed) to the field names yielded at that
    offset. A window anchored at record ``k`` spans records ``k + min_offset .. k + max_offset``
    (at most 65536 of them) and exists only if it lies inside the dataset and every consecutive
    timestamp gap over that whole span (also at offsets not named) is ``<= delta_threshold``; a
    NaN or NaT timestamp makes every gap it takes part in too large. A window holds every
    offset of its span in ascending order, an offset not named as an empty dict (as Petastorm's
    windows do). With ``timestamp_overlap=False`` the windows are picked greedily in storage
    order so that no two share a record of their span.

    A name that is no field of the dataset is a regular expression matched against the whole
    of each field's name, as Petastorm's are (``"^id.*$"``, ``"cam_[0-9]+"``): it stands for
    every field it matches, in the schema's order; a field's own name always means that field
    alone. ``timestamp_field`` may be one too, if it matches exactly one field. Names are
    matched when a stream is made, and one that matches nothing is a SchemaError.

    ``delta_threshold`` is an int or float for numeric timestamps, and a ``np.timedelta64`` (or
    ``datetime.timedelta``) with a fixed unit for datetime64 / timedelta64 timestamps.
    """

    def __init__(
        self,
        fields: Mapping[int, Sequence[str]],
        delta_threshold: int | float | np.timedelta64 | datetime.timedelta,
        timestamp_field: str,
        timestamp_overlap: bool = True,
    ) -> None:
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError(
                "NGram fields must be a non-empty dict of int offset -> list of field names, "
                f"got {fields!r}"
            )
        checked = {_check_offset(k): v for k, v in fields.items()}
        self.offsets: tuple[int, ...] = tuple(sorted(checked))
        self.fields: dict[int, tuple[str, ...]] = {
            o: _check_names(o, checked[o]) for o in self.offsets
        }
        self.delta_threshold = _check_delta(delta_threshold)
        if not isinstance(timestamp_field, str) or not timestamp_field:
            raise ValueError(
                f"timestamp_field must be a non-empty str, got {timestamp_field!r} of type "
                f"{type(timestamp_field).__name__}"
            )
        self.timestamp_field = timestamp_field
        self.timestamp_overlap = check_bool("timestamp_overlap", timestamp_overlap)
        self.min_offset = self.offsets[0]
        self.max_offset = self.offsets[-1]
        self.span = _check_span(self.offsets)
        self._offset_array = np.array(self.offsets, dtype=np.int64)
        # The last schema resolved against, and what each offset reads from it.
        self._resolved: tuple[Schema, dict[int, tuple[Field, ...]]] | None = None

    # --- identity: NGrams key caches ---

    def _delta_key(self) -> tuple[str, int | float]:
        delta = self.delta_threshold
        if isinstance(delta, np.timedelta64):
            # By unit, so that equal keys hash equal (5 s and 5000 ms are merely different keys).
            return str(delta.dtype), int(delta.astype(np.int64))
        return "number", delta

    def anchor_key(self) -> tuple[Any, ...]:
        """What the anchors depend on: not the fields named, so NGrams differing only there
        share one computation."""
        return (
            self.min_offset,
            self.span,
            self._delta_key(),
            self.timestamp_field,
            self.timestamp_overlap,
        )

    def _key(self) -> tuple[Any, ...]:
        return (tuple(self.fields.items()), *self.anchor_key())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NGram):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        fields = ", ".join(f"{o}: {list(names)!r}" for o, names in self.fields.items())
        return (
            f"NGram(fields={{{fields}}}, delta_threshold={self.delta_threshold!r}, "
            f"timestamp_field={self.timestamp_field!r}, "
            f"timestamp_overlap={self.timestamp_overlap})"
        )

    def identity(self) -> dict[str, Any]:
        """This NGram as plain data (JSON as it is): what a stream's saved state records of
        it, so that a state is loaded only by a stream with the same windows."""
        delta = self.delta_threshold
        if isinstance(delta, np.timedelta64):
            threshold: Any = f"{int(delta.astype(np.int64))} {np.datetime_data(delta.dtype)[0]}"
        else:
            threshold = delta
        return {
            "fields": {str(offset): list(names) for offset, names in self.fields.items()},
            "delta_threshold": threshold,
            "timestamp_field": self.timestamp_field,
            "timestamp_overlap": self.timestamp_overlap,
        }

    def __getstate__(self) -> dict[str, Any]:
        return {
            "fields": self.fields,
            "delta_threshold": self.delta_threshold,
            "timestamp_field": self.timestamp_field,
            "timestamp_overlap": self.timestamp_overlap,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    # --- what the Stream asks ---

    def field_names(self, schema: Schema) -> frozenset[str]:
        """Every field of ``schema`` a window needs: those yielded at any offset and the
        timestamp field."""
        names = {self.timestamp_name(schema)}
        for group in self.names(schema).values():
            names.update(group)
        return frozenset(names)

    def names(self, schema: Schema) -> dict[int, tuple[str, ...]]:
        """The names of the fields each offset yields, from ``min_offset`` to ``max_offset``:
        each name or regular expression of ``fields`` matched against ``schema``, in order,
        without repeats; none for an offset not named. SchemaError naming a name that
        matches no field."""
        out: dict[int, tuple[str, ...]] = {}
        for offset in range(self.min_offset, self.max_offset + 1):
            found: dict[str, None] = {}  # (ordered, without repeats)
            for name in self.fields.get(offset, ()):
                found.update(dict.fromkeys(_matched(schema, name, f"field (offset {offset})")))
            out[offset] = tuple(found)
        return out

    def timestamp_name(self, schema: Schema) -> str:
        """The field of ``schema`` that ``timestamp_field`` names (or, as a regular expression,
        matches: SchemaError unless exactly one)."""
        found = _matched(schema, self.timestamp_field, "timestamp_field")
        if len(found) > 1:
            raise SchemaError(
                f"NGram timestamp_field {self.timestamp_field!r} matches {len(found)} fields "
                f"{list(found)}: it must name one (e.g. {'^' + re.escape(found[0]) + '$'!r})"
            )
        return found[0]

    def check(self, schema: Schema) -> None:
        """Raises SchemaError naming the field if ``schema`` lacks a field (or a regular
        expression matches none) or cannot carry the timestamps (a non-nullable numeric or
        datetime64 scalar, matching the threshold)."""
        self.names(schema)
        name = self.timestamp_name(schema)
        field = schema[name]
        kind = field.dtype.kind if field.kind == "numeric" else None
        if kind not in ("i", "u", "f", "m", "M") or field.shape != () or field.nullable:
            raise SchemaError(
                f"NGram timestamp_field {name!r} must be a non-nullable scalar of a real number "
                f"or datetime64 dtype, got {field!r}"
            )
        is_time = kind in ("m", "M")
        if is_time != isinstance(self.delta_threshold, np.timedelta64):
            want = "a np.timedelta64, e.g. np.timedelta64(5, 's')" if is_time else "a number"
            raise SchemaError(
                f"NGram timestamp_field {name!r} holds {field.dtype_name}: delta_threshold must "
                f"be {want}, got {self.delta_threshold!r}"
            )

    def anchors(self, dataref: LeafSource) -> np.ndarray:
        """The anchors of all windows of ``dataref``, sorted (the greedy set when
        ``timestamp_overlap=False``), as a read-only int64 array, computed once per DataRef
        object (``yogadl_plus.stream.ngram_reader.anchors``, which says more)."""
        from yogadl_plus.stream import ngram_reader

        return ngram_reader.anchors(self, dataref)

    def window_records(self, anchors: np.ndarray | Sequence[int]) -> np.ndarray:
        """Record indices, shape ``(len(anchors), len(offsets))``: ``anchor + offset``."""
        a = np.asarray(anchors)
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise TypeError(f"anchors must be a 1-d array of ints, got {a.dtype} {a.shape}")
        return a.astype(np.int64, copy=False)[:, None] + self._offset_array[None, :]

    # --- what a window holds (yogadl_plus.stream.ngram_reader reads them) ---

    def resolve(self, schema: Schema) -> dict[int, tuple[Field, ...]]:
        """The Field objects each offset of a window yields, from ``min_offset`` to
        ``max_offset`` (none for an offset not named): what ``read_batch`` reads."""
        last = self._resolved
        if last is not None and last[0] is schema:  # (asked for every block of windows read)
            return last[1]
        found = {o: schema.select(names) for o, names in self.names(schema).items()}
        self._resolved = (schema, found)
        return found

    def read_windows(
        self, dataref: LeafSource, anchors: np.ndarray | Sequence[int]
    ) -> list[dict[int, dict[str, Any]]]:
        """The windows at ``anchors``, one ``{offset: {field: value}}`` dict each
        (``yogadl_plus.stream.ngram_reader.read_windows``)."""
        from yogadl_plus.stream import ngram_reader

        return ngram_reader.read_windows(self, dataref, anchors)

    def read_batch(
        self,
        dataref: LeafSource,
        anchors: np.ndarray | Sequence[int],
        allocate: Allocate | None = None,
    ) -> dict[int, dict[str, Any]]:
        """The windows at ``anchors`` as one batch ``{offset: {field: stacked}}``
        (``yogadl_plus.stream.ngram_reader.read_batch``, which says more)."""
        from yogadl_plus.stream import ngram_reader

        return ngram_reader.read_batch(self, dataref, anchors, allocate)

    def assemble(
        self, columns_by_offset: Mapping[int, Mapping[str, Any]], j: int
    ) -> dict[int, dict[str, Any]]:
        """Window ``j`` out of a batch ``{offset: {field: column}}`` (as read_batch returns)."""
        return {
            offset: {name: column[j] for name, column in columns.items()}
            for offset, columns in columns_by_offset.items()
        }

    def iter_assembled(
        self, columns_by_offset: Mapping[int, Mapping[str, Any]], count: int
    ) -> Iterator[dict[int, dict[str, Any]]]:
        """Windows ``0 .. count-1`` of a batch, one dict each."""
        groups = [(offset, list(columns.items())) for offset, columns in columns_by_offset.items()]
        for j in range(count):
            yield {offset: {name: column[j] for name, column in group} for offset, group in groups}
