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


# --------------------------------------------------------------------------- hive partitions


def hive_table(rows: int = 120) -> pa.Table:
    ids = np.arange(rows)
    return pa.table(
        {
            "x": ids.astype(np.float64),
            "day": pa.array([None if i % 11 == 10 else int(i % 3) for i in ids], pa.int64()),
            "tag": [["a", "b/c=d", "z"][i % 3] for i in ids],
        }
    )


def cached(source, tmp_path, version: str, **kwargs) -> ydl.DataRef:
    storage = ydl.LocalStorage(tmp_path / "s")
    return ydl.cache_dataset(source, "hive", version, storage, progress=False, **kwargs)


def rows_of(ref: ydl.DataRef) -> list[dict]:
    batch = ref.get_batch(list(range(len(ref))))
    return [{k: v[i] for k, v in batch.items()} for i in range(len(ref))]


def by_files(root, partition_cols: list[str]) -> list[dict]:
    """The rows as a reader of the sorted file paths, one file after the other, sees them:
    each file's rows in order, with the values of its key=value folders."""
    import glob
    import os
    import urllib.parse

    rows = []
    for path in sorted(glob.glob(f"{root}/**/*.parquet", recursive=True)):
        if "/_" in path[len(str(root)) :]:
            continue
        folders = dict(part.split("=", 1) for part in os.path.relpath(path, root).split("/")[:-1])
        for row in pq.read_table(path).to_pylist():
            for col in partition_cols:
                text = urllib.parse.unquote(folders[col])
                row[col] = None if text == "__HIVE_DEFAULT_PARTITION__" else text
            rows.append(row)
    return rows


@pytest.mark.parametrize("workers", [None, 2])
def test_hive_partition_columns_are_cached(tmp_path, workers):
    """pq.write_to_dataset(partition_cols=...): before, the partition columns were dropped."""
    root = tmp_path / "hive"
    pq.write_to_dataset(hive_table(), root, partition_cols=["day", "tag"], row_group_size=7)
    ref = cached(str(root), tmp_path, f"w{workers}", workers=workers)
    assert ref.schema.names == ("x", "day", "tag")
    assert ref.schema["day"].dtype == np.int32 and ref.schema["day"].nullable  # pyarrow's type
    assert ref.schema["tag"].kind == "str" and not ref.schema["tag"].nullable
    got = rows_of(ref)
    expected = by_files(root, ["day", "tag"])  # sorted paths, then file order, then row order
    for row in expected:
        row["day"] = None if row["day"] is None else int(row["day"])
    assert [(r["x"], r["day"], r["tag"]) for r in got] == [
        (r["x"], r["day"], r["tag"]) for r in expected
    ]
    assert sorted(r["x"] for r in got) == list(range(120))  # every row once
    assert {r["tag"] for r in got} == {"a", "b/c=d", "z"}  # folder names URL-decoded
    assert [r["day"] for r in got if r["x"] % 11 == 10] == [None] * 10


def test_serial_and_parallel_builds_give_the_same_records(tmp_path):
    root = tmp_path / "hive"
    pq.write_to_dataset(hive_table(300), root, partition_cols=["tag", "day"], row_group_size=5)
    serial = rows_of(cached(str(root), tmp_path, "serial"))
    parallel = rows_of(cached(str(root), tmp_path, "parallel", workers=2))
    assert serial == parallel and len(serial) == 300
    assert list(serial[0]) == ["x", "tag", "day"]


@pytest.mark.parametrize("workers", [None, 2])
def test_columns_select_partition_columns(tmp_path, workers):
    root = tmp_path / "hive"
    pq.write_to_dataset(hive_table(), root, partition_cols=["day", "tag"], row_group_size=9)
    picked = cached(ParquetSource(str(root), columns=["tag", "x"]), tmp_path, "tx", workers=workers)
    assert picked.schema.names == ("tag", "x")
    assert {(r["x"] % 3, r["tag"]) for r in rows_of(picked)} == {(0, "a"), (1, "b/c=d"), (2, "z")}
    only = cached(ParquetSource(str(root), columns=["day"]), tmp_path, "d", workers=workers)
    assert only.schema.names == ("day",)  # no column of the files at all: rows are counted
    whole = cached(str(root), tmp_path, "all")
    assert [r["day"] for r in rows_of(only)] == [r["day"] for r in rows_of(whole)]


def spark_like_layout(root) -> None:
    """What Spark's df.write.partitionBy("id") leaves: part files named by task and job,
    _SUCCESS, hidden .crc checksums, a null partition; plus the _temporary folder of an
    attempt that failed (its files are no data: Spark's readers skip folders named _*)."""
    for key, start in (("3", 0), ("10", 10), ("__HIVE_DEFAULT_PARTITION__", 20)):
        folder = root / f"id={key}"
        folder.mkdir(parents=True)
        name = "part-00000-4d1c2b5e-0f3a-4a8e-9d6e-1c2b3a4d5e6f.c000.snappy.parquet"
        pq.write_table(pa.table({"v": np.arange(start, start + 5)}), folder / name)
        (folder / f".{name}.crc").write_bytes(b"crc")
    (root / "_SUCCESS").write_bytes(b"")
    attempt = root / "_temporary" / "0" / "_temporary" / "attempt_0" / "id=3"
    attempt.mkdir(parents=True)
    pq.write_table(pa.table({"v": np.arange(100, 105)}), attempt / "part-00000.snappy.parquet")


def test_a_spark_style_layout_reads_as_spark_reads_it(tmp_path):
    root = tmp_path / "spark"
    spark_like_layout(root)
    ref = cached(str(root), tmp_path, "v")
    got = [(r["v"], r["id"]) for r in rows_of(ref)]
    # sorted paths: id=10 before id=3 before id=__HIVE_DEFAULT_PARTITION__
    assert got == [(v, 10) for v in range(10, 15)] + [(v, 3) for v in range(5)] + [
        (v, None) for v in range(20, 25)
    ]
    assert ref.schema["id"].dtype == np.int32 and ref.schema["id"].nullable


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore::FutureWarning")  # pyspark on pandas 3
def test_a_spark_partitioned_write_caches_as_spark_reads_it(spark, tmp_path):
    """Real Spark: df.write.partitionBy(...), a null partition, values Spark escapes."""
    from pyspark.sql import functions as F

    root = tmp_path / "spark"
    tags = F.array(F.lit("a/b=c:d%"), F.lit("plain"), F.lit("x y"))
    spark.range(0, 200, numPartitions=2).select(
        "id",
        F.when(F.col("id") % 9 == 8, None).otherwise(F.col("id") % 4).cast("int").alias("bucket"),
        F.element_at(tags, (F.col("id") % 3 + 1).cast("int")).alias("tag"),
    ).write.partitionBy("bucket", "tag").parquet(str(root))
    theirs = spark.read.parquet(str(root))
    types = {f.name: f.dataType.simpleString() for f in theirs.schema.fields}
    assert (types["bucket"], types["tag"]) == ("int", "string")
    expected = {r["id"]: (r["bucket"], r["tag"]) for r in theirs.collect()}

    ref = cached(str(root), tmp_path, "v", workers=2)
    assert ref.schema["bucket"].dtype == np.int32 and ref.schema["bucket"].nullable
    assert ref.schema["tag"].kind == "str"
    assert {r["id"]: (r["bucket"], r["tag"]) for r in rows_of(ref)} == expected
    assert len(ref) == 200


def test_a_glob_keeps_the_partition_folders_below_its_fixed_part(tmp_path):
    root = tmp_path / "spark"
    spark_like_layout(root)
    ref = cached(str(root / "id=[13]*" / "*.parquet"), tmp_path, "glob")
    assert [(r["v"], r["id"]) for r in rows_of(ref)] == [(v, 10) for v in range(10, 15)] + [
        (v, 3) for v in range(5)
    ]
    one = cached(str(root / "id=3"), tmp_path, "one")  # as pyarrow and Spark: below it only
    assert one.schema.names == ("v",)


@pytest.mark.parametrize(
    "folders, expected",
    [
        (["k=1", "k=-2147483648"], pa.int32()),
        (["k=1", "k=2147483648"], pa.int64()),  # pyarrow would make it a string
        (["k=1", "k=07"], pa.string()),  # 07 keeps its zero
        (["k=1", "k=1.5"], pa.string()),
        (["k=2024-01-01"], pa.string()),
        (["k=__HIVE_DEFAULT_PARTITION__"], pa.string()),
    ],
)
def test_partition_types_follow_pyarrow_keeping_every_value(tmp_path, folders, expected):
    for k, folder in enumerate(folders):
        (tmp_path / "d" / folder).mkdir(parents=True)
        pq.write_table(pa.table({"v": [k]}), tmp_path / "d" / folder / "a.parquet")
    source = ParquetSource(str(tmp_path / "d"))
    assert source.arrow_schema.field("k").type == expected
    values = [r["k"] for r in source.records()]
    texts = [f.split("=", 1)[1] for f in sorted(folders, key=lambda f: f + "/")]  # by path
    assert [None if v is None else str(v) for v in values] == [
        None if t == "__HIVE_DEFAULT_PARTITION__" else t for t in texts
    ]


def test_partition_types_can_be_given(tmp_path):
    root = tmp_path / "hive"
    pq.write_to_dataset(hive_table(30), root, partition_cols=["day", "tag"])
    wide = ParquetSource(str(root), partitioning={"day": "int64", "tag": pa.string()})
    assert wide.schema["day"].dtype == np.int64
    ref = cached(wide, tmp_path, "wide", workers=2)
    assert ref.schema["day"].dtype == np.int64 and ref[0]["day"].dtype == np.int64
    schema = ydl.Schema(
        [
            ydl.Field("x", np.float64),
            ydl.Field("day", np.int64, nullable=True),
            ydl.Field("tag", str),
        ]
    )
    assert cached(str(root), tmp_path, "schema", schema=schema).schema["day"].dtype == np.int64
    plain = ParquetSource(str(root), partitioning=None)
    assert plain.schema.names == ("x",)
    with pytest.raises(ydl.SchemaError, match=r"the folder tag=a is not a int32"):
        ParquetSource(str(root), partitioning={"tag": "int32"})
    with pytest.raises(ValueError, match=r"names \['nope'\], which are not partition folders"):
        ParquetSource(str(root), partitioning={"nope": "int32"})
    with pytest.raises(ValueError, match="not a pyarrow type"):
        ParquetSource(str(root), partitioning={"day": "no-such-type"})
    with pytest.raises(ValueError, match="partitioning='directory'"):
        ParquetSource(str(root), partitioning="directory")


def test_a_null_partition_needs_a_nullable_field(tmp_path):
    root = tmp_path / "spark"
    spark_like_layout(root)
    schema = ydl.Schema([ydl.Field("v", np.int64), ydl.Field("id", np.int32)])
    with pytest.raises(ydl.SchemaError, match="field 'id': got None but the field is not nullable"):
        cached(str(root), tmp_path, "strict", schema=schema)


def test_partition_folders_that_disagree_are_named(tmp_path):
    for folder in ("id=1", "other"):
        (tmp_path / "d" / folder).mkdir(parents=True)
        pq.write_table(pa.table({"v": [1]}), tmp_path / "d" / folder / "a.parquet")
    with pytest.raises(ydl.SchemaError, match=r"other/a.parquet is in the partition folders none"):
        ParquetSource(str(tmp_path / "d"))
    assert ParquetSource(str(tmp_path / "d"), partitioning=None).schema.names == ("v",)
    (tmp_path / "e" / "v=1").mkdir(parents=True)
    pq.write_table(pa.table({"v": [1]}), tmp_path / "e" / "v=1" / "a.parquet")
    with pytest.raises(ydl.SchemaError, match="'v' is both a column of the Parquet files and a"):
        ParquetSource(str(tmp_path / "e"))


def test_fingerprint_tracks_the_partition_columns(tmp_path):
    root = tmp_path / "spark"
    spark_like_layout(root)
    hive = ParquetSource(str(root)).fingerprint()
    assert hive != ParquetSource(str(root), partitioning=None).fingerprint()
    assert hive != ParquetSource(str(root), partitioning={"id": "int64"}).fingerprint()
    (root / "id=3").rename(root / "id=4")  # same files, other partition values
    assert ParquetSource(str(root)).fingerprint() != hive


def test_empty_lists_of_lists_keep_the_fields_rank(tmp_path):
    grids = [[], [[1.0, 2.0]], [[], []], [[3.0]] * 3]
    rows3 = [[], [[1, 2, 3]], [[4, 5, 6]] * 2, []]
    path = tmp_path / "grids.parquet"
    pq.write_table(
        pa.table(
            {
                "grid": pa.array(grids, pa.list_(pa.list_(pa.float64()))),
                "rows3": pa.array(rows3, pa.list_(pa.list_(pa.int32(), 3))),
            }
        ),
        path,
    )
    ref = ydl.cache_dataset(str(path), "g", "v", ydl.LocalStorage(tmp_path / "s"), progress=False)
    assert [ref[i]["grid"].shape for i in range(4)] == [(0, 0), (1, 2), (2, 0), (3, 1)]
    assert [ref[i]["rows3"].shape for i in range(4)] == [(0, 3), (1, 3), (2, 3), (0, 3)]
    assert ref[3]["grid"].tolist() == grids[3] and ref[2]["rows3"].tolist() == rows3[2]


@pytest.mark.parametrize("workers", [None, 2])
def test_files_that_disagree_on_a_column_type_are_named(tmp_path, workers):
    """pyarrow casts every file to the first file's types: a float64 column of a later file
    would lose its digits as float32 (0.1 -> 0.10000000149), a string one fail to parse."""
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"x": pa.array([1.5], pa.float32())}), tmp_path / "data/a.parquet")
    pq.write_table(pa.table({"x": pa.array([0.1], pa.float64())}), tmp_path / "data/b.parquet")
    message = r"b\.parquet: column 'x' is double in this file but float in the dataset's"
    with pytest.raises(ydl.SchemaError, match=message):
        ydl.cache_dataset(str(tmp_path / "data"), "d", "v", ydl.LocalStorage(tmp_path / "s"),
                          progress=False, workers=workers)  # fmt: skip
    # Narrower ints and another string encoding cast exactly: read as the dataset's types.
    pq.write_table(pa.table({"i": pa.array([7], pa.int64())}), tmp_path / "c.parquet")
    pq.write_table(pa.table({"i": pa.array([8], pa.int16())}), tmp_path / "d.parquet")
    paths = [str(tmp_path / "c.parquet"), str(tmp_path / "d.parquet")]
    ref = ydl.cache_dataset(paths, "i", "v", ydl.LocalStorage(tmp_path / "s"), progress=False,
                            workers=workers)  # fmt: skip
    assert [int(ref[i]["i"]) for i in range(2)] == [7, 8] and ref.schema["i"].dtype == np.int64


@pytest.mark.parametrize("workers", [None, 2])
def test_a_wider_int_column_is_read_as_the_datasets_type_unless_a_value_does_not_fit(
    tmp_path, workers
):
    """The dataset's int32 (its first file's) holds a later file's int64 values that fit; a
    value that does not is refused naming the file, never wrapped around."""
    storage = ydl.LocalStorage(tmp_path / "s")
    for name, last in (("fits", 2**31 - 1), ("over", 2**31)):
        folder = tmp_path / name
        folder.mkdir()
        pq.write_table(pa.table({"i": pa.array([1], pa.int32())}), folder / "a.parquet")
        pq.write_table(pa.table({"i": pa.array([2, last], pa.int64())}), folder / "b.parquet")
        if last < 2**31:
            ref = ydl.cache_dataset(str(folder), name, "v", storage, progress=False,
                                    workers=workers)  # fmt: skip
            assert [int(ref[i]["i"]) for i in range(3)] == [1, 2, last]
            continue
        with pytest.raises(ydl.SchemaError, match=r"b\.parquet.*does not fit.*int64 to int32"):
            ydl.cache_dataset(str(folder), name, "v", storage, progress=False, workers=workers)
    assert storage.list() == [("fits", "v")]


@pytest.mark.parametrize("workers", [None, 2])
def test_a_file_without_rows_caches_no_record(tmp_path, workers):
    pq.write_table(table(0, 3).slice(0, 0), tmp_path / "empty.parquet")
    pq.write_table(table(0, 3), tmp_path / "full.parquet")
    storage = ydl.LocalStorage(tmp_path / "s")
    empty = ydl.cache_dataset(str(tmp_path / "empty.parquet"), "e", "v", storage, progress=False,
                              workers=workers)  # fmt: skip
    assert len(empty) == 0 and list(empty.schema.names) == table(0, 3).column_names
    paths = [str(tmp_path / "empty.parquet"), str(tmp_path / "full.parquet")]
    both = ydl.cache_dataset(paths, "b", "v", storage, progress=False, workers=workers)
    assert [int(both[i]["id"]) for i in range(len(both))] == [0, 1, 2]
