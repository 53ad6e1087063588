"""Parquet sources: paths, globs, directories, lists, columns=, Arrow types -> fields."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import yogadl_plus as ydl
from yogadl_plus.sources import ParquetSource, as_source


def table(start: int, rows: int, with_nulls: bool = False) -> pa.Table:
    ids = np.arange(start, start + rows, dtype=np.int64)
    vec = np.stack([ids, ids * 2, ids * 3], axis=1).astype(np.float32)
    label = pa.array([None if with_nulls and i % 5 == 0 else int(i % 3) for i in ids], pa.int32())
    return pa.table(
        {
            "id": ids,
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), 3),
            "mat": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(vec, 2, axis=0).ravel()), 3), 2
            ),
            "tokens": pa.array([list(range(i % 4)) for i in ids], pa.list_(pa.int16())),
            "grid": pa.array(
                [[[float(i)] * (i % 3)] * (i % 2 + 1) for i in ids],
                pa.list_(pa.list_(pa.float64())),
            ),
            "name": pa.array([f"n{i}" for i in ids]),
            "raw": pa.array([bytes([i % 256]) * (i % 3) for i in ids], pa.binary()),
            "label": label,
            "when": pa.array(ids.astype("datetime64[ms]")),
        }
    )


@pytest.fixture
def parquet_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(table(0, 150), folder / "part-0.parquet", row_group_size=40)
    pq.write_table(table(150, 100), folder / "part-1.parquet", row_group_size=40)
    return folder


def test_arrow_types_become_fields(parquet_dir):
    schema = ParquetSource(str(parquet_dir)).schema
    assert schema["id"].dtype == np.int64 and schema["id"].shape == ()
    assert schema["vec"].shape == (3,) and schema["vec"].dtype == np.float32
    assert schema["mat"].shape == (2, 3)
    assert schema["tokens"].shape == (None,) and schema["tokens"].dtype == np.int16
    assert schema["grid"].shape == (None, None) and schema["grid"].dtype == np.float64
    assert schema["name"].kind == "str" and schema["raw"].kind == "bytes"
    assert schema["when"].dtype == np.dtype("datetime64[ms]")
    assert not any(f.nullable for f in schema), "no column holds nulls"


@pytest.mark.parametrize("how", ["dir", "glob", "list", "file_url", "single"])
def test_path_forms(parquet_dir, tmp_path, how):
    files = sorted(str(p) for p in parquet_dir.glob("*.parquet"))
    source = {
        "dir": str(parquet_dir),
        "glob": str(parquet_dir / "part-*.parquet"),
        "list": files,
        "file_url": "file://" + str(parquet_dir),
        "single": files[0],
    }[how]
    ref = ydl.cache_dataset(source, "p", how, ydl.LocalStorage(tmp_path / "s"), progress=False)
    assert len(ref) == (150 if how == "single" else 250)
    assert ref.manifest.source_kind == "parquet"


def test_values_read_back(parquet_dir, tmp_path):
    ref = ydl.cache_dataset(
        str(parquet_dir), "p", "v", ydl.LocalStorage(tmp_path / "s"), progress=False
    )
    r = ref[173]
    assert r["id"] == 173 and r["name"] == "n173" and r["label"] == 173 % 3
    assert r["vec"].tolist() == [173, 346, 519] and r["mat"].shape == (2, 3)
    assert r["tokens"].tolist() == list(range(173 % 4)) and r["tokens"].dtype == np.int16
    assert r["grid"].shape == (2, 173 % 3) and r["grid"].tolist() == [[173.0] * 2] * 2
    assert r["raw"] == bytes([173]) * (173 % 3)
    assert r["when"] == np.datetime64(173, "ms")
    batch = ref.get_batch(range(0, 250, 50), fields=["id", "vec"])
    assert batch["vec"].shape == (5, 3) and batch["id"].tolist() == [0, 50, 100, 150, 200]


def test_columns_subset(parquet_dir, tmp_path):
    source = ParquetSource(str(parquet_dir), columns=["name", "id"])
    ref = ydl.cache_dataset(source, "p", "cols", ydl.LocalStorage(tmp_path / "s"), progress=False)
    assert ref.schema.names == ("name", "id") and ref[3] == {"name": "n3", "id": 3}
    with pytest.raises(ydl.SchemaError, match=r"columns \['nope'\] are not in the Parquet data"):
        ParquetSource(str(parquet_dir), columns=["nope"])


def test_columns_with_nulls_become_nullable(tmp_path):
    path = tmp_path / "nulls.parquet"
    pq.write_table(table(0, 30, with_nulls=True), path)
    ref = ydl.cache_dataset(str(path), "n", "v", ydl.LocalStorage(tmp_path / "s"), progress=False)
    assert ref.schema["label"].nullable and not ref.schema["id"].nullable
    assert ref[0]["label"] is None and ref[1]["label"] == 1


@pytest.mark.parametrize(
    "values, arrow_type, shape, message",
    [
        ([[1.0, 2.0], [3.0], [4.0, 5.0, 6.0]], pa.float32(), (2,), r"record 1, .*got shape \(1,\)"),
        ([[1.0, 2.0], [3.0, None]], pa.float32(), (2,), "record 1, .*null \\(None\\) inside"),
        ([[1, 2], [3, None]], pa.int32(), None, "record 1, .*null \\(None\\) inside"),
        ([[True], [None]], pa.bool_(), None, "record 1, .*null \\(None\\) inside"),
    ],
    ids=["ragged-in-a-fixed-shape", "null-inside-fixed", "null-inside-int", "null-inside-bool"],
)
def test_arrays_that_do_not_fit_name_their_record(tmp_path, values, arrow_type, shape, message):
    """Never re-split across records, never a null turned into NaN or False."""
    pq.write_table(pa.table({"v": pa.array(values, pa.list_(arrow_type))}), tmp_path / "a.parquet")
    dtype = np.dtype(arrow_type.to_pandas_dtype())
    schema = ydl.Schema([ydl.Field("v", dtype, shape)]) if shape else None
    with pytest.raises(ydl.SchemaError, match=message):
        ydl.cache_dataset(str(tmp_path / "a.parquet"), "a", "v1", ydl.LocalStorage(tmp_path / "s"),
                          schema=schema, progress=False)  # fmt: skip


def test_unsupported_arrow_type_names_the_column(tmp_path):
    path = tmp_path / "struct.parquet"
    pq.write_table(pa.table({"ok": [1, 2], "nested": [{"a": 1}, {"a": 2}]}), path)
    with pytest.raises(ydl.SchemaError, match="column 'nested': Arrow type struct"):
        ydl.cache_dataset(str(path), "s", "v", ydl.LocalStorage(tmp_path / "s"), progress=False)
    ref = ydl.cache_dataset(
        ParquetSource(str(path), columns=["ok"]),
        "s",
        "v",
        ydl.LocalStorage(tmp_path / "s"),
        progress=False,
    )
    assert ref[1] == {"ok": 2}


@pytest.mark.parametrize(
    "bad, message",
    [("/no/such/file.parquet", "does not exist"), ("/no/such/*.parquet", "matches no file")],
)
def test_missing_paths(bad, message):
    with pytest.raises(ydl.YogaError, match=message):
        ParquetSource(bad)


def test_fingerprint_tracks_size_and_mtime(tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(table(0, 10), path)
    before = ParquetSource(str(path)).fingerprint()
    assert before == ParquetSource(str(path)).fingerprint()
    pq.write_table(table(0, 11), path)
    assert ParquetSource(str(path)).fingerprint() != before


def test_as_source_dispatch(tmp_path):
    assert as_source([{"a": 1}]).kind == "iterable"
    assert as_source(lambda: iter([{"a": 1}])).kind == "iterable"
    with pytest.raises(TypeError, match="cannot cache a int"):
        as_source(5)
