"""Columns in memory cached in one call: a dict of numpy arrays (or lists), pandas and polars
DataFrames, pyarrow Tables, RecordBatchReaders and datasets. Every column type round-trips;
what cannot be cached is refused naming the column, before anything is written; the build
encodes a batch of columns per call, byte for byte what a record-by-record build writes."""

from __future__ import annotations

import datetime
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import yogadl_plus as ydl
from yogadl_plus.cache.batch_encoder import BatchEncoder
from yogadl_plus.cache.layout import RecordLayout
from yogadl_plus.cache.writer import EqualValues
from yogadl_plus.schema import MAX_NAME_BYTES

N = 257  # not a multiple of anything


def _cache(storage, source, name="cols", **kwargs):
    return ydl.cache_dataset(source, name, "v1", storage, progress=False, **kwargs)


def _all(ref):
    return ref.get_batch(np.arange(len(ref)))


def _same(got, want):
    """Values equal, NaN equal to NaN, arrays and lists compared element by element."""
    if isinstance(want, np.ndarray) and want.dtype.kind not in "OUS":
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
        assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc")
        return
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, np.ndarray):
            _same(g, w)
        else:
            assert g == w or (g != g and w != w), (g, w)


# --- a dict of numpy arrays ---


def test_a_dict_of_numpy_arrays_round_trips_every_dtype(local_storage):
    rng = np.random.default_rng(0)
    columns = {
        "f32": rng.normal(size=(N, 3, 2)).astype(np.float32),
        "f16": rng.normal(size=N).astype(np.float16),
        "f64": np.where(np.arange(N) % 5 == 0, np.nan, rng.normal(size=N)),
        "i8": rng.integers(-128, 127, N).astype(np.int8),
        "u64": rng.integers(0, 2**63, N, dtype=np.uint64),
        "i64": np.arange(N, dtype=np.int64),
        "flag": np.arange(N) % 3 == 0,
        "c64": (rng.normal(size=N) + 1j * rng.normal(size=N)).astype(np.complex64),
        "when": np.datetime64("2024-01-01T00:00:00", "s") + np.arange(N).astype("m8[s]"),
        "took": np.arange(N).astype("m8[ms]"),
        "big_endian": np.arange(N, dtype=">i4"),
        "text": np.array([f"text {i} é" for i in range(N)]),
        "blob": np.array([b"\x01b" * (i % 4) for i in range(N)], dtype="S8"),
        "image": rng.integers(0, 255, (N, 4, 4, 3), dtype=np.uint8),
    }
    ref = _cache(local_storage, columns)
    schema = {f.name: f for f in ref.schema}
    assert schema["f32"].shape == (3, 2) and schema["image"].shape == (4, 4, 3)
    assert schema["i64"].shape == () and not any(f.nullable for f in ref.schema)
    assert schema["text"].kind == "str" and schema["blob"].kind == "bytes"
    assert schema["big_endian"].dtype == np.dtype("<i4")
    got = _all(ref)
    for name, want in columns.items():
        if name == "big_endian":
            want = want.astype("<i4")
        elif want.dtype.kind in "US":
            want = want.tolist()
        _same(got[name], want)
    assert ref.manifest.source_kind == "numpy"


def test_a_dict_of_lists_and_object_arrays_finds_its_fields_from_the_values(local_storage):
    ragged = [np.arange(i % 5, dtype=np.int16) for i in range(N)]
    images = np.empty(N, dtype=object)
    for i in range(N):
        images[i] = np.full((1 + i % 3, 2), i, np.float32)
    columns = {
        "ints": list(range(N)),
        "floats": [i / 2 for i in range(N)],
        "words": [f"w{i}" for i in range(N)],
        "maybe": [None if i % 4 == 0 else f"m{i}" for i in range(N)],
        "maybe_number": [None if i % 4 == 1 else i for i in range(N)],
        "bytes": [bytes([i % 256]) * (i % 3) for i in range(N)],
        "ragged": ragged,
        "images": images,
        "rows": [[i, i + 1] for i in range(N)],
    }
    ref = _cache(local_storage, columns)
    schema = {f.name: f for f in ref.schema}
    assert schema["ragged"].shape == (None,) and schema["ragged"].dtype == np.int16
    assert schema["images"].shape == (None, 2) and schema["rows"].shape == (2,)
    assert schema["maybe"].nullable and schema["maybe_number"].nullable
    assert not schema["words"].nullable
    for i in (0, 1, 2, 5, N - 1):
        record = ref[i]
        assert record["ints"] == i and record["floats"] == i / 2 and record["words"] == f"w{i}"
        assert record["maybe"] == (None if i % 4 == 0 else f"m{i}")
        assert record["maybe_number"] == (None if i % 4 == 1 else i)
        assert record["bytes"] == bytes([i % 256]) * (i % 3)
        _same(record["ragged"], ragged[i])
        _same(record["images"], images[i])
        _same(record["rows"], np.array([i, i + 1]))


# --- pandas, Arrow, polars ---


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame(
        {
            "i": np.arange(N, dtype=np.int32),
            "f": rng.normal(size=N),
            "text": [f"t{i}" for i in range(N)],
            "string": pd.array([None if i % 6 == 0 else f"s{i}" for i in range(N)], "string"),
            "blob": [bytes([i % 256, 7]) for i in range(N)],
            "category": pd.Categorical(["low", "high", "mid"] * (N // 3) + ["low"] * (N % 3)),
            "when": pd.date_range("2021-03-04", periods=N, freq="min"),
            "when_utc": pd.date_range("2021-03-04", periods=N, freq="min", tz="UTC"),
            "nullable_int": pd.array([None if i % 5 == 0 else i for i in range(N)], "Int64"),
            "nullable_float": pd.array(
                [None if i % 7 == 0 else i / 4 for i in range(N)], "Float64"
            ),
            "nullable_bool": pd.array(
                [None if i % 3 == 0 else i % 2 == 0 for i in range(N)], "boolean"
            ),
            "arrays": [np.full(4, i, np.float32) for i in range(N)],
            "ragged": [np.arange(i % 3) for i in range(N)],
        }
    )


def test_a_pandas_frame_round_trips_every_column_kind(local_storage):
    frame = _frame()
    ref = _cache(local_storage, frame)
    schema = {f.name: f for f in ref.schema}
    assert schema["arrays"].shape == (4,) and schema["ragged"].shape == (None,)
    assert schema["category"].kind == "str" and schema["when_utc"].dtype == np.dtype("M8[ns]")
    for name in ("string", "nullable_int", "nullable_float", "nullable_bool"):
        assert schema[name].nullable, name
    assert not schema["i"].nullable and schema["i"].dtype == np.int32
    for i in (0, 1, 5, 6, 7, N - 1):
        record = ref[i]
        row = frame.iloc[i]
        assert record["i"] == row["i"] and record["f"] == row["f"]
        assert record["text"] == row["text"] and record["blob"] == row["blob"]
        assert record["string"] == (None if i % 6 == 0 else f"s{i}")
        assert record["category"] == row["category"]
        assert record["when"] == row["when"].to_datetime64()
        assert record["when_utc"] == row["when_utc"].tz_convert(None).to_datetime64()
        assert record["nullable_int"] == (None if i % 5 == 0 else i)
        assert record["nullable_float"] == (None if i % 7 == 0 else i / 4)
        assert record["nullable_bool"] == (None if i % 3 == 0 else i % 2 == 0)
        _same(record["arrays"], row["arrays"])
        _same(record["ragged"], row["ragged"])
    assert ref.manifest.source_kind == "pandas"


def _table() -> pa.Table:
    return pa.table(
        {
            "i": pa.array(range(N), pa.int64()),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(3 * N, dtype=np.float32)), 3),
            "tokens": pa.array([list(range(i % 4)) for i in range(N)], pa.list_(pa.int32())),
            "s": pa.array([None if i % 9 == 0 else f"s{i}" for i in range(N)]),
            "d": pa.array([datetime.date(2020, 1, 1 + i % 28) for i in range(N)]),
        }
    )


def _check_table_ref(ref, nullable_declared=False):
    schema = {f.name: f for f in ref.schema}
    assert schema["x"].shape == (3,) and schema["tokens"].shape == (None,)
    assert schema["s"].nullable
    assert schema["i"].nullable == nullable_declared  # a Table knows it has no null
    for i in (0, 1, 9, N - 1):
        record = ref[i]
        assert record["i"] == i and record["s"] == (None if i % 9 == 0 else f"s{i}")
        _same(record["x"], np.arange(3 * i, 3 * i + 3, dtype=np.float32))
        _same(record["tokens"], np.arange(i % 4, dtype=np.int32))
        assert record["d"] == np.datetime64(datetime.date(2020, 1, 1 + i % 28))


def test_an_arrow_table_and_record_batch_round_trip(local_storage):
    _check_table_ref(_cache(local_storage, _table(), "table"))
    batch = _table().combine_chunks().to_batches()[0]
    _check_table_ref(_cache(local_storage, batch, "batch"))


def test_a_record_batch_reader_is_read_once_in_order(local_storage):
    reader = _table().to_reader(max_chunksize=50)
    ref = _cache(local_storage, reader, "reader")
    # A reader's schema says what may hold nulls, not what does: declared nullable is nullable.
    _check_table_ref(ref, nullable_declared=True)
    assert len(ref) == N


def test_an_arrow_dataset_round_trips_and_builds_in_parallel(local_storage, tmp_path):
    folder = tmp_path / "parquet"
    folder.mkdir()
    table = _table()
    for k, start in enumerate(range(0, N, 60)):
        pq.write_table(table.slice(start, 60), folder / f"part-{k}.parquet")
    dataset = pads.dataset(str(folder), format="parquet")
    serial = _cache(local_storage, dataset, "dataset")
    _check_table_ref(serial, nullable_declared=True)
    parallel = _cache(local_storage, dataset, "dataset-parallel", workers=2)
    _check_table_ref(parallel, nullable_declared=True)
    assert len(parallel) == N
    for name in ("i", "s"):
        assert _all(parallel)[name] == _all(serial)[name] or np.array_equal(
            _all(parallel)[name], _all(serial)[name]
        )
    _check_table_ref(
        _cache(local_storage, pads.dataset(table), "in-memory"), nullable_declared=True
    )


def test_a_polars_frame_round_trips(local_storage):
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame(
        {
            "i": np.arange(N, dtype=np.int64),
            "s": [None if i % 4 == 0 else f"p{i}" for i in range(N)],
            "x": pl.Series([[float(i), i + 0.5] for i in range(N)], dtype=pl.Array(pl.Float64, 2)),
            "tokens": [list(range(i % 3)) for i in range(N)],
        }
    )
    ref = _cache(local_storage, frame)
    schema = {f.name: f for f in ref.schema}
    assert schema["x"].shape == (2,) and schema["tokens"].shape == (None,)
    assert schema["s"].nullable and not schema["i"].nullable
    for i in (0, 1, N - 1):
        record = ref[i]
        assert record["i"] == i and record["s"] == (None if i % 4 == 0 else f"p{i}")
        _same(record["x"], np.array([i, i + 0.5]))
        _same(record["tokens"], np.arange(i % 3))
    assert ref.manifest.source_kind == "polars"


# --- parallel builds and a given schema ---


def test_a_parallel_build_of_columns_equals_a_serial_one(local_storage):
    rng = np.random.default_rng(2)
    columns = {
        "x": rng.normal(size=(5000, 8)).astype(np.float32),
        "label": np.arange(5000),
        "name": [f"n{i}" for i in range(5000)],
    }
    serial = _cache(local_storage, columns, "serial", chunk_bytes=32 << 10)
    parallel = _cache(local_storage, columns, "parallel", chunk_bytes=32 << 10, workers=2)
    a, b = _all(serial), _all(parallel)
    assert np.array_equal(a["x"], b["x"]) and np.array_equal(a["label"], b["label"])
    assert a["name"] == b["name"]
    assert len(parallel.manifest.chunks) > 2


def test_a_given_schema_casts_columns_only_where_no_value_changes(local_storage):
    schema = ydl.Schema([ydl.Field("x", np.int64), ydl.Field("y", np.float32, (2,))])
    ref = _cache(
        local_storage,
        {"x": np.arange(N, dtype=np.int32), "y": np.ones((N, 2), np.float16)},
        "cast",
        schema=schema,
    )
    assert ref[3]["x"] == 3 and ref[3]["x"].dtype == np.int64
    lossy = {"x": np.arange(N, dtype=np.int64), "y": np.full((N, 2), 0.1, np.float64)}
    with pytest.raises(ydl.SchemaError, match=r"column 'y'.*float64"):
        _cache(local_storage, lossy, "lossy", schema=schema)
    shaped = {"x": np.arange(N), "y": np.ones((N, 3), np.float32)}
    with pytest.raises(ydl.SchemaError, match=r"column 'y'.*shape \(257, 3\)"):
        _cache(local_storage, shaped, "shaped", schema=schema)
    listed = {"x": [1, 2, "three"], "y": [[0, 0]] * 3}
    with pytest.raises(ydl.SchemaError, match="record 2, field 'x'"):
        _cache(local_storage, listed, "listed", schema=schema)


# --- refusals, before anything is written ---


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        ({"x": np.arange(3), "y": np.arange(4)}, "column 'y' has 4 rows but column 'x' has 3"),
        ({"x": np.arange(3), "y": ["a", "b"]}, "column 'y' has 2 rows"),
        ({}, "no columns"),
        ({"x": np.int64(3)}, "column 'x': got a 0-d array"),
        ({"x": np.zeros(3, dtype=[("a", "i4"), ("b", "f4")])}, "column 'x'.*structured"),
        ({"x": [1, "a", 2.0]}, "field 'x' holds different kinds of values"),
        ({"x": [None, None]}, "column 'x': every value is None"),
        ({"x": [np.zeros(2), np.zeros((2, 2))]}, "field 'x' has values of different ranks"),
        ({"x": "abc"}, "column 'x': expected a numpy array or a sequence"),
        ({"x": np.array([{"a": 1}] * 3)}, "record 0, field 'x': cannot infer a field from a dict"),
        ({3: np.arange(3)}, "column names are field names"),
        ({"x": np.array(["a", "b"]).reshape(2, 1)}, "column 'x': an array of strings"),
    ],
)
def test_columns_that_cannot_be_cached_are_refused_naming_the_column(local_storage, columns, match):
    with pytest.raises(ydl.SchemaError, match=match):
        _cache(local_storage, columns, "bad")
    assert not os.path.exists(os.path.join(local_storage.root, "bad"))


def test_frames_that_cannot_be_cached_are_refused_naming_the_column(local_storage):
    with pytest.raises(ydl.SchemaError, match=r"column names are field names.*0"):
        _cache(local_storage, pd.DataFrame(np.zeros((3, 2))), "bad")
    twice = pd.DataFrame([[1, 2]], columns=["a", "a"])
    with pytest.raises(ydl.SchemaError, match="'a' appears more than once"):
        _cache(local_storage, twice, "bad")
    nested = pa.table({"s": pa.array([{"a": 1}, {"a": 2}])})
    with pytest.raises(ydl.SchemaError, match="column 's'"):
        _cache(local_storage, nested, "bad")
    assert not os.path.exists(os.path.join(local_storage.root, "bad"))


# --- the columnar write path ---


def test_a_build_from_columns_encodes_no_record_one_by_one(local_storage, monkeypatch):
    def refuse(self, record, index):
        raise AssertionError("a record was encoded on its own")

    monkeypatch.setattr(RecordLayout, "encode", refuse)
    columns = {"x": np.ones((N, 4), np.float32), "s": [f"s{i}" for i in range(N)]}
    ref = _cache(local_storage, columns)
    assert ref[N - 1]["s"] == f"s{N - 1}"


@pytest.mark.parametrize("nullable", [False, True])
def test_a_batch_encodes_byte_for_byte_as_its_records_do(nullable):
    rng = np.random.default_rng(3)
    schema = ydl.Schema(
        [
            ydl.Field("x", np.float32, (3,)),
            ydl.Field("y", np.int64),
            ydl.Field("s", str, nullable=nullable),
            ydl.Field("v", np.uint8, (None, 2), nullable=nullable),
            ydl.Field("z", np.int16, (2,), codec=ydl.codecs.Compressed()),
            ydl.Field("when", "datetime64[us]"),
        ]
    )
    layout = RecordLayout(schema)
    n = 300
    columns = {
        "x": rng.normal(size=(n, 3)).astype(np.float32),
        "y": np.arange(n),
        "s": [None if nullable and i % 3 == 0 else "é" * (i % 5) for i in range(n)],
        "v": [
            None if nullable and i % 4 == 0 else np.full((i % 3, 2), i % 256, np.uint8)
            for i in range(n)
        ],
        "z": rng.integers(-5, 5, (n, 2)).astype(np.int16),
        "when": np.arange(n).astype("M8[us]"),
    }
    values, chunk_columns, _ = BatchEncoder(layout).encode(columns, n, 0)
    records = [{name: columns[name][i] for name in columns} for i in range(n)]
    assert list(values) == [layout.encode(r, i) for i, r in enumerate(records)]
    assert np.array_equal(chunk_columns["y"], columns["y"])


def test_fixed_only_batches_are_handed_to_lmdb_as_one_buffer():
    layout = RecordLayout(ydl.Schema([ydl.Field("x", np.float32, (2,)), ydl.Field("y", np.int8)]))
    columns = {"x": np.arange(8, dtype=np.float32).reshape(4, 2), "y": np.arange(4, dtype=np.int8)}
    values, _, _ = BatchEncoder(layout).encode(columns, 4, 0)
    assert isinstance(values, EqualValues) and len(values) == 4
    records = [{"x": columns["x"][i], "y": columns["y"][i]} for i in range(4)]
    assert [v for _, v in values.items(0, 0, 4)] == [layout.encode(r, 0) for r in records]


# --- values that must come back exactly, or be refused naming the record ---


def test_strings_keep_their_nul_characters_from_every_kind_of_column(local_storage):
    pl = pytest.importorskip("polars")
    texts = ["a\x00", "b", "\x00\x00", "c\x00d"]
    blobs = [b"a\x00", b"", b"\x00", b"d"]
    sources = {
        "dict": {"s": texts, "b": blobs},
        "object-array": {"s": np.array(texts, dtype=object), "b": np.array(blobs, dtype=object)},
        "pandas": pd.DataFrame({"s": texts, "b": blobs}),
        "polars": pl.DataFrame({"s": texts, "b": blobs}),
    }
    for name, source in sources.items():
        ref = _cache(local_storage, source, name)
        assert [ref[i]["s"] for i in range(4)] == texts, name
        assert [ref[i]["b"] for i in range(4)] == blobs, name


def test_a_list_of_strings_is_never_made_a_fixed_width_numpy_array():
    # A numpy array of str takes rows x the longest string: 5,000 rows with one string of
    # 5,000 characters would be 100 MB (37 GiB for 100,000 of 100,000).
    texts = ["short"] * 5000
    texts[7] = "x" * 5000
    tracemalloc.start()
    try:
        source = ydl.sources.as_source({"s": texts})
        rows = sum(len(columns["s"]) for columns, _ in source.column_batches())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows == 5000 and peak < 5 << 20, peak


@pytest.mark.parametrize(
    ("values", "bad"),
    [([2**53 + 1, 0.5], 0), ([[0.5, 1.0], [0.5, 2**53 + 1]], 1), ([0.5, None, -(2**60) - 1], 2)],
)
def test_big_ints_among_floats_are_refused_naming_the_record_as_from_a_generator(
    local_storage, values, bad
):
    with pytest.raises(ydl.SchemaError, match=rf"record {bad}, field 'x': .*exactly") as columns:
        _cache(local_storage, {"x": values}, "columns")
    with pytest.raises(ydl.SchemaError) as records:
        _cache(local_storage, [{"x": v} for v in values], "records")
    assert str(columns.value) == str(records.value)
    exact = _cache(local_storage, {"x": [2**53, 0.5, None]}, "exact")  # ints floats hold: kept
    assert [exact[i]["x"] for i in range(3)] == [2.0**53, 0.5, None]


def test_polars_object_columns_are_taken_as_their_python_values(local_storage):
    pl = pytest.importorskip("polars")
    arrays = [np.full((2, i + 1), i, np.float32) for i in range(3)]
    frame = pl.DataFrame(
        {
            "i": [1, 2, 3],
            "text": pl.Series(["a\x00", None, "c"], dtype=pl.Object),
            "array": pl.Series(arrays, dtype=pl.Object),
        }
    )
    ref = _cache(local_storage, frame)
    assert ref.schema["text"].kind == "str" and ref.schema["text"].nullable
    assert ref.schema["array"].shape == (2, None) and ref.schema["array"].dtype == np.float32
    assert [ref[i]["text"] for i in range(3)] == ["a\x00", None, "c"]
    for i in range(3):
        _same(ref[i]["array"], arrays[i])
    odd = pl.DataFrame({"o": pl.Series([1, object()], dtype=pl.Object)})
    with pytest.raises(ydl.SchemaError, match="record 1, field 'o': cannot infer a field"):
        _cache(local_storage, odd, "odd")


# --- empty columns ---


def _empty_sources(folder):
    pl = pytest.importorskip("polars")
    table = pa.table({"x": pa.array([], pa.int32()), "s": pa.array([], pa.string())})
    pq.write_table(table, folder / "empty.parquet")
    return {
        "table": table,
        "batch": pa.RecordBatch.from_pylist([], schema=table.schema),
        "reader": table.to_reader(),
        "dataset": pads.dataset(str(folder / "empty.parquet"), format="parquet"),
        "parquet": str(folder / "empty.parquet"),
        "dict": {"x": np.zeros(0, np.int32), "s": np.zeros(0, str)},
        "pandas": pd.DataFrame({"x": np.zeros(0, np.int32), "s": pd.array([], "string")}),
        "polars": pl.DataFrame(
            {"x": pl.Series([], dtype=pl.Int32), "s": pl.Series([], dtype=pl.String)}
        ),
    }


def test_empty_columns_of_known_types_cache_a_version_of_no_records(local_storage, tmp_path):
    for name, source in _empty_sources(tmp_path).items():
        ref = _cache(local_storage, source, name)
        assert len(ref) == 0, name
        assert [(f.name, f.dtype_name) for f in ref.schema] == [("x", "<i4"), ("s", "str")], name
        assert list(ref.stream(batch_size=4)) == []


def test_empty_columns_that_say_nothing_of_their_type_need_a_schema(local_storage):
    schema = ydl.Schema([ydl.Field("x", np.int64)])
    for name, source in {
        "list": {"x": []},
        "objects": pd.DataFrame({"x": pd.Series([], dtype=object)}),
    }.items():
        with pytest.raises(ydl.SchemaError, match=r"column 'x' is empty.*pass schema="):
            _cache(local_storage, source, name)
        assert len(_cache(local_storage, source, name, schema=schema)) == 0
    # As records without any: refused, or cached as no record with a schema.
    with pytest.raises(ydl.SchemaError, match="no records; pass schema="):
        _cache(local_storage, iter([]), "records")
    assert len(_cache(local_storage, iter([]), "records", schema=schema)) == 0


# --- field names ---


@pytest.mark.parametrize("kind", ["dict", "table", "pandas", "records"])
def test_field_names_longer_than_a_key_holds_are_refused_before_anything_is_written(
    local_storage, kind
):
    def source(name):
        columns = {name: np.arange(3), "s": ["a", "b", "c"]}
        if kind == "table":
            return pa.table(columns)
        if kind == "pandas":
            return pd.DataFrame(columns)
        if kind == "records":
            return [{name: i, "s": "a"} for i in range(3)]
        return columns

    longest = "é" * (MAX_NAME_BYTES // 2) + "x"  # (a column of its chunks: a key)
    ref = _cache(local_storage, source(longest), "longest")
    assert ref[2][longest] == 2 and ref.get_batch([0, 1, 2], [longest])[longest].tolist() == [
        0,
        1,
        2,
    ]
    too_long = "x" * 5000
    with pytest.raises(ydl.SchemaError, match=r"field 'xxxx.*5000 bytes.*at most 507 bytes"):
        _cache(local_storage, source(too_long), "bad")
    # (Records are read to infer their schema under the builder's lock: its file may remain.)
    assert not list(Path(local_storage.root).glob("bad/*/**"))


# --- a pyarrow dataset's files ---


def test_a_dataset_whose_files_disagree_on_a_type_is_refused_naming_the_file(
    local_storage, tmp_path
):
    folder = tmp_path / "parts"
    folder.mkdir()
    pq.write_table(pa.table({"x": pa.array([1.5], pa.float32()), "i": [1]}), folder / "a.parquet")
    pq.write_table(pa.table({"x": pa.array([0.1], pa.float64()), "i": [2]}), folder / "b.parquet")
    dataset = pads.dataset(str(folder), format="parquet")
    message = r"b\.parquet: column 'x' is double in this file but float in the dataset's schema"
    for workers in (None, 2):
        with pytest.raises(ydl.SchemaError, match=message):
            _cache(local_storage, dataset, "mixed", workers=workers)
    # With a schema whose type holds every file's values, each is cast exactly.
    wide = pads.dataset(
        str(folder), format="parquet", schema=pa.schema({"x": pa.float64(), "i": pa.int64()})
    )
    ref = _cache(local_storage, wide, "wide")
    assert [float(ref[i]["x"]) for i in range(2)] == [1.5, 0.1]


def test_a_dataset_file_whose_int_does_not_fit_the_datasets_type_is_named(local_storage, tmp_path):
    folder = tmp_path / "ints"
    folder.mkdir()
    pq.write_table(pa.table({"i": pa.array([1], pa.int32())}), folder / "a.parquet")
    pq.write_table(pa.table({"i": pa.array([2, 2**31], pa.int64())}), folder / "b.parquet")
    dataset = pads.dataset(str(folder), format="parquet")
    for workers in (None, 2):
        with pytest.raises(ydl.SchemaError, match=r"b\.parquet: a value does not fit.*int32"):
            _cache(local_storage, dataset, "ints", workers=workers)
    assert local_storage.list() == []
