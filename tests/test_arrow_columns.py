"""Arrow columns of every type we store, with nulls at the top (a null row), in the middle (a
null inside a row's lists) and in every row, built through every kind of columnar source and
compared with a plain reference: each value comes back exactly (nanoseconds, NaN, NUL
characters), a null row as None, and a row that holds no array (a null inside it, or inner
lists of differing lengths) is refused naming its record and the field."""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl

_INTS = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
    pa.uint8(): (0, 2**8 - 1),
    pa.uint32(): (0, 2**32 - 1),
    pa.uint64(): (0, 2**64 - 1),
}
_UNITS = ("s", "ms", "us", "ns")
_DAY_MS = 86_400_000


def _leaf_values(arrow_type: pa.DataType) -> st.SearchStrategy[Any]:
    """Python values of a leaf type, as pa.array takes them (timestamps and dates as ints)."""
    if arrow_type in _INTS:
        low, high = _INTS[arrow_type]
        return st.integers(low, high)
    if pa.types.is_floating(arrow_type):
        return st.floats(width=arrow_type.bit_width)  # NaN and infinities included
    if pa.types.is_boolean(arrow_type):
        return st.booleans()
    if pa.types.is_timestamp(arrow_type):
        return st.integers(-(2**50), 2**50)
    if pa.types.is_date32(arrow_type):
        return st.integers(-(10**5), 10**5)
    if pa.types.is_date64(arrow_type):
        return st.integers(-(10**5), 10**5).map(lambda days: days * _DAY_MS)
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return st.text(st.characters(codec="utf-8"), max_size=4).map(
            lambda s: s + "\x00" * (len(s) % 2)
        )
    return st.binary(max_size=4)


_NUMBER_LEAVES = [
    *_INTS,
    pa.float32(),
    pa.float64(),
    pa.bool_(),
    *(pa.timestamp(u) for u in _UNITS),
    pa.timestamp("ns", tz="UTC"),
    pa.date32(),
    pa.date64(),
]
_TEXT_LEAVES = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]


def _nested(leaf: pa.DataType) -> list[pa.DataType]:
    return [
        pa.list_(leaf),
        pa.large_list(leaf),
        pa.list_(leaf, 3),
        pa.list_(pa.list_(leaf)),
        pa.list_(pa.list_(leaf, 2)),
        pa.list_(pa.large_list(leaf), 2),
    ]


#: Every Arrow type a column of ours may have: leaves, and lists of numbers of every kind (and
#: lists of text, which are refused).
LEAF_TYPES = [*_NUMBER_LEAVES, *_TEXT_LEAVES]
LIST_TYPES = [t for leaf in LEAF_TYPES for t in _nested(leaf)]
#: Types that keep their Arrow type through Parquet, pandas (ArrowDtype) and polars alike.
PORTABLE_TYPES = [
    pa.int16(),
    pa.uint64(),
    pa.float32(),
    pa.bool_(),
    pa.timestamp("ns"),
    pa.timestamp("us", tz="UTC"),
    pa.large_string(),
    pa.large_binary(),
    pa.large_list(pa.int8()),
    pa.list_(pa.float64(), 3),
    pa.large_list(pa.large_list(pa.timestamp("ms"))),
    pa.large_list(pa.list_(pa.bool_(), 2)),
]


@dataclass
class Case:
    """A column of one Arrow type, as Python values (None for a null, anywhere)."""

    arrow_type: pa.DataType
    values: list[Any]

    @property
    def array(self) -> pa.Array:
        return pa.array(self.values, self.arrow_type)


def _row(draw: Any, arrow_type: pa.DataType, inner_nulls: bool, rectangular: bool) -> Any:
    """One row's value: lists of the type's lengths (ragged unless ``rectangular``), a null
    inside with some chance when ``inner_nulls``."""
    if not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) and not (
        pa.types.is_fixed_size_list(arrow_type)
    ):
        return draw(_leaf_values(arrow_type))
    child = arrow_type.value_type
    if pa.types.is_fixed_size_list(arrow_type):
        length = arrow_type.list_size
    else:
        length = draw(st.integers(0, 3))
    items = []
    inner_length = draw(st.integers(0, 3))
    for _ in range(length):
        if inner_nulls and draw(st.integers(0, 2)) == 0:
            items.append(None)
        elif rectangular and (pa.types.is_list(child) or pa.types.is_large_list(child)):
            items.append([draw(_leaf_values(child.value_type)) for _ in range(inner_length)])
        else:
            items.append(_row(draw, child, inner_nulls, rectangular))
    return items


@st.composite
def cases(draw: Any, *types: list[pa.DataType]) -> Case:
    """A column of a type of one of ``types`` (lists, each as likely): nulls at the top in no
    row, some or every row, and maybe nulls inside rows and ragged rows."""
    arrow_type = draw(st.sampled_from(draw(st.sampled_from(types))))
    rows = draw(st.sampled_from([0, 1, 2, 3, 5, 6]))
    top = draw(st.sampled_from(["none", "some", "some", "every"]))
    inner_nulls = draw(st.booleans())
    values = []
    for _ in range(rows):
        if top == "every" or (top == "some" and draw(st.booleans())):
            values.append(None)
        else:
            rectangular = draw(st.integers(0, 5)) > 0
            values.append(_row(draw, arrow_type, inner_nulls, rectangular))
    return Case(arrow_type, values)


# --- the plain reference ---


def _depth(arrow_type: pa.DataType) -> list[int | None]:
    """The dims the Arrow type says: a list size, or None for a list of any length."""
    dims: list[int | None] = []
    while (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or (pa.types.is_fixed_size_list(arrow_type))
    ):
        dims.append(arrow_type.list_size if pa.types.is_fixed_size_list(arrow_type) else None)
        arrow_type = arrow_type.value_type
    return dims


def _leaf(arrow_type: pa.DataType) -> pa.DataType:
    while _depth(arrow_type):
        arrow_type = arrow_type.value_type
    return arrow_type


def _dtype(leaf: pa.DataType) -> np.dtype:
    if pa.types.is_timestamp(leaf):
        return np.dtype(f"datetime64[{leaf.unit}]")
    if pa.types.is_date32(leaf):
        return np.dtype("datetime64[D]")
    if pa.types.is_date64(leaf):
        return np.dtype("datetime64[ms]")
    return np.dtype(leaf.to_pandas_dtype())


def _holds_no_array(value: Any) -> bool:
    """A null inside, or inner lists of differing lengths side by side."""
    if not isinstance(value, list):
        return False
    if any(v is None or _holds_no_array(v) for v in value):
        return True
    shapes = {np.shape(v) if isinstance(v, list) else () for v in value}
    return len(shapes) > 1


def _expected(case: Case, row: int) -> Any:
    value = case.values[row]
    leaf = _leaf(case.arrow_type)
    if value is None or pa.types.is_string(leaf) or pa.types.is_large_string(leaf):
        return value
    if pa.types.is_binary(leaf) or pa.types.is_large_binary(leaf):
        return value
    array = np.array(value, dtype=_dtype(leaf))
    dims = _depth(case.arrow_type)
    if array.ndim < len(dims):  # empty lists: the dims below are the list sizes, else 0
        array = array.reshape(array.shape + tuple(d or 0 for d in dims[array.ndim :]))
    return array


def _refusal(case: Case) -> str | None:
    """What the build must say instead of caching, or None when it caches the column."""
    leaf = _leaf(case.arrow_type)
    if (
        _depth(case.arrow_type)
        and not pa.types.is_primitive(leaf)
        and not (pa.types.is_date(leaf) or pa.types.is_timestamp(leaf))
    ):
        return "column 'x'"
    bad = [i for i, v in enumerate(case.values) if v is not None and _holds_no_array(v)]
    return f"record {bad[0]}, field 'x'" if bad else None


def _same(got: Any, want: Any) -> None:
    if want is None or isinstance(want, (str, bytes)):
        assert type(got) is type(want) and got == want, (got, want)
        return
    got = np.asarray(got)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (got, want)
    assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), (got, want)


# --- building ---

_NAMES = itertools.count()


def _check(storage: ydl.LocalStorage, case: Case, source: Any) -> None:
    refusal = _refusal(case)
    name = f"c{next(_NAMES)}"
    if refusal is not None:
        with pytest.raises(ydl.SchemaError, match=refusal):
            ydl.cache_dataset(source, name, "v1", storage, progress=False)
        return
    ref = ydl.cache_dataset(source, name, "v1", storage, progress=False)
    assert len(ref) == len(case.values)
    for row in range(len(case.values)):
        _same(ref[row]["x"], _expected(case, row))


def _through(kind: str, table: pa.Table, folder: str) -> Any:
    """``table`` as a source of ``kind``."""
    if kind == "batch":
        return table.combine_chunks().to_batches()[0] if table.num_rows else table
    if kind == "reader":
        return table.to_reader(max_chunksize=2)
    if kind == "pandas":
        return table.to_pandas(types_mapper=pd.ArrowDtype)
    if kind == "polars":
        import polars as pl

        return pl.from_arrow(table)
    path = f"{folder}/part-{next(_NAMES)}.parquet"
    pq.write_table(table, path, row_group_size=3)
    return path if kind == "parquet" else pads.dataset(path, format="parquet")


@pytest.fixture(scope="module")
def storage() -> Any:
    with tempfile.TemporaryDirectory() as root:
        yield ydl.LocalStorage(root)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(LEAF_TYPES, LIST_TYPES))
def test_an_arrow_table_of_any_type_caches_each_value_exactly_or_names_the_record(storage, case):
    _check(storage, case, pa.table({"x": case.array}))


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=cases(PORTABLE_TYPES),
    kind=st.sampled_from(["batch", "reader", "parquet", "dataset", "pandas", "polars"]),
)
def test_every_columnar_source_caches_a_column_as_the_table_does(storage, case, kind):
    with tempfile.TemporaryDirectory() as folder:
        _check(storage, case, _through(kind, pa.table({"x": case.array}), folder))


# --- what the differential tests found, one by one, through every kind of source ---

SOURCES = ["table", "batch", "reader", "parquet", "dataset", "pandas", "polars"]


def _source(kind: str, column: pa.Array, folder: str) -> Any:
    table = pa.table({"x": column})
    return table if kind == "table" else _through(kind, table, folder)


@pytest.mark.parametrize("kind", SOURCES)
def test_nanoseconds_beside_a_null_are_kept(storage, tmp_path, kind):
    when = [2**62 + 1, None, -7]
    lists = [[1, 2**62 + 3], None, []]
    scalars = pa.array(when, pa.timestamp("ns"))
    source = _source(kind, scalars, str(tmp_path))
    ref = ydl.cache_dataset(source, f"ns-{kind}", "v1", storage, progress=False)
    assert [ref[i]["x"] for i in range(3)] == [np.datetime64(w, "ns") if w else None for w in when]
    source = _source(kind, pa.array(lists, pa.large_list(pa.timestamp("ns"))), str(tmp_path))
    ref = ydl.cache_dataset(source, f"ns-lists-{kind}", "v1", storage, progress=False)
    assert ref[0]["x"].tolist() == np.array(lists[0], "M8[ns]").tolist() and ref[1]["x"] is None


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize(
    "column",
    [
        pa.array([[True], None, [False, None]], pa.large_list(pa.bool_())),
        pa.array([[0.5], None, [float("nan"), None]], pa.large_list(pa.float64())),
        pa.array([[1], None, [2, None]], pa.large_list(pa.int64())),
        pa.array([[1, 2], None, [3, None]], pa.list_(pa.int64(), 2)),
    ],
    ids=["bool", "float", "int", "fixed-size"],
)
def test_a_null_inside_a_list_is_refused_naming_the_record_never_made_a_value(
    storage, tmp_path, kind, column
):
    source = _source(kind, column, str(tmp_path))
    with pytest.raises(ydl.SchemaError, match=r"record 2, field 'x': .*null \(None\) inside"):
        ydl.cache_dataset(source, f"inside-{kind}", "v1", storage, progress=False)


@pytest.mark.parametrize("kind", SOURCES)
def test_ragged_lists_beside_a_null_row_are_refused_naming_the_record(storage, tmp_path, kind):
    column = pa.array([None, [[1, 2]], [[1], [2, 3]]], pa.large_list(pa.large_list(pa.int64())))
    source = _source(kind, column, str(tmp_path))
    with pytest.raises(ydl.SchemaError, match=r"record 2, field 'x': .*ragged nested list"):
        ydl.cache_dataset(source, f"ragged-{kind}", "v1", storage, progress=False)
