"""Spark DataFrames as a source: each partition is written as chunks by a Spark task (real
PySpark, local[2]); the cache holds the rows in partition order, and a task killed mid-write
and run again by Spark leaves no duplicate chunks."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.damage import version_files, written_names

import yogadl_plus as ydl
from yogadl_plus.cache.manifest import MANIFEST_NAME
from yogadl_plus.storage.sink import ChunkSink

pyspark = pytest.importorskip("pyspark")
F = pytest.importorskip("pyspark.sql.functions")

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # pyspark on pandas 3
]


def events(spark, rows: int = 3000, partitions: int = 3):
    """A DataFrame of every column type a cache can hold, each value a function of its id."""
    return spark.range(0, rows, numPartitions=partitions).select(
        "id",
        (F.col("id") * 0.5).cast("float").alias("x"),
        F.expr("transform(sequence(0, cast(id % 5 as int)), k -> cast(id + k as float))").alias(
            "v"
        ),
        F.format_string("row-%d", "id").alias("name"),
        F.encode(F.format_string("row-%d", "id"), "utf-8").alias("blob"),
        F.expr("date_add(date'2020-01-01', cast(id % 1000 as int))").alias("day"),
        F.timestamp_seconds("id").alias("at"),
        (F.col("id") % 2 == 0).alias("even"),
        F.expr("array(array(id, id), array(id, id))").cast("array<array<short>>").alias("grid"),
    )


def assert_holds_events(ref: ydl.DataRef, ids: list[int]) -> None:
    got = ref.get_batch(list(range(len(ref))))
    assert len(ref) == len(ids)
    assert got["id"].tolist() == ids
    ids_ = np.asarray(ids)
    assert np.array_equal(got["x"], (ids_ * 0.5).astype(np.float32))
    assert all(np.array_equal(v, np.arange(i, i + i % 5 + 1, dtype=np.float32))
               for v, i in zip(got["v"], ids))  # fmt: skip
    assert got["name"] == [f"row-{i}" for i in ids]
    assert got["blob"] == [f"row-{i}".encode() for i in ids]
    assert np.array_equal(got["day"], np.datetime64("2020-01-01") + ids_ % 1000)
    assert np.array_equal(got["at"], ids_.astype("datetime64[s]").astype("datetime64[us]"))
    assert np.array_equal(got["even"], ids_ % 2 == 0)
    assert all(np.array_equal(g, np.full((2, 2), i, np.int16)) for g, i in zip(got["grid"], ids))


# ----------------------------------------------------------------- what is cached


def test_partitions_are_written_by_tasks_and_cached_in_their_order(spark, local_storage):
    ref = ydl.cache_dataset(events(spark), "events", "v1", local_storage, chunk_bytes=64 << 10)
    assert_holds_events(ref, list(range(3000)))
    assert ref.manifest.source_kind == "spark"
    assert [f.name for f in ref.schema.fields] == [
        "id", "x", "v", "name", "blob", "day", "at", "even", "grid",
    ]  # fmt: skip
    assert ref.schema["v"].shape == (None,) and ref.schema["grid"].shape == (None, None)
    assert ref.schema["at"].dtype == np.dtype("datetime64[us]")
    assert not any(f.nullable for f in ref.schema.fields)  # Spark calls most columns nullable
    # Each partition's task wrote chunks of its own, in partition order.
    parts = [os.path.basename(c.file).split("-")[0] for c in ref.manifest.chunks]
    assert parts == sorted(parts) and set(parts) == {"p00000", "p00001", "p00002"}
    assert len(ref.manifest.chunks) > 3
    assert version_files(local_storage, "events", "v1") == {
        MANIFEST_NAME,
        *(c.file for c in ref.manifest.chunks),
    }
    ref.verify()  # every chunk's sha256, as the driver recorded it from the tasks


def test_record_order_follows_the_partitions_of_a_sorted_dataframe(spark, local_storage):
    frame = (
        events(spark, rows=1200)
        .repartitionByRange(4, F.desc("id"))  # after a shuffle, as orderBy() leaves it
        .sortWithinPartitions(F.desc("id"))
    )
    ref = ydl.cache_dataset(frame, "events", "sorted", local_storage)
    assert_holds_events(ref, list(range(1199, -1, -1)))
    assert len({os.path.basename(c.file).split("-")[0] for c in ref.manifest.chunks}) == 4


def test_the_cache_reads_like_any_other(spark, local_storage):
    ref = ydl.cache_dataset(events(spark, rows=500, partitions=2), "events", "v1", local_storage)
    seen = [int(r["id"]) for r in ref.stream(shuffle=True, shuffle_seed=3)]
    assert sorted(seen) == list(range(500)) and seen != list(range(500))


def test_an_empty_dataframe_makes_an_empty_version(spark, local_storage):
    ref = ydl.cache_dataset(events(spark).limit(0), "events", "empty", local_storage)
    assert len(ref) == 0 and ref.schema["v"].shape == (None,)


def test_schema_makes_fields_nullable_or_fixed(spark, local_storage):
    frame = events(spark, rows=100, partitions=2).select(
        F.when(F.col("id") == 7, None).otherwise(F.col("x")).alias("x"),
        F.expr("array(cast(id as float), cast(id as float))").alias("pair"),
    )
    schema = ydl.Schema(
        [ydl.Field("x", np.float32, nullable=True), ydl.Field("pair", np.float32, (2,))]
    )
    ref = ydl.cache_dataset(frame, "events", "v1", local_storage, schema=schema)
    assert ref[7]["x"] is None and ref[8]["x"] == np.float32(4.0)
    assert ref.get_batch([3, 4])["pair"].shape == (2, 2)


# ----------------------------------------------------------------- errors


def test_a_null_fails_the_build_naming_partition_record_and_field(spark, local_storage):
    frame = events(spark, rows=3000).withColumn(
        "x", F.when(F.col("id") == 1234, None).otherwise(F.col("x"))
    )
    with pytest.raises(ydl.SchemaError, match=r"Spark partition 1 .*record 234, field 'x'.*None"):
        ydl.cache_dataset(frame, "events", "v1", local_storage)
    assert local_storage.list() == []
    left = os.listdir(os.path.join(local_storage.root, "events"))
    assert [e for e in left if not e.startswith("+lock")] == []  # no staging folder, no chunk


def test_unsupported_columns_are_named_before_spark_runs(spark, local_storage):
    frame = events(spark, rows=10).select(F.col("id").cast("decimal(10,2)").alias("price"))
    with pytest.raises(ydl.SchemaError, match=r"column 'price': Spark type decimal\(10,2\).*cast"):
        ydl.cache_dataset(frame, "events", "v1", local_storage)
    nested = events(spark, rows=10).select(F.array("name").alias("names"))
    with pytest.raises(ydl.SchemaError, match="column 'names': arrays of string"):
        ydl.cache_dataset(nested, "events", "v1", local_storage)


def test_column_names_with_dots_or_differing_in_case(spark, local_storage):
    frame = spark.range(0, 50, numPartitions=2).selectExpr("id as `a.b`", "id * 2 as ID", "id")
    ref = ydl.cache_dataset(frame, "odd-names", "v1", local_storage)
    assert list(ref.schema.names) == ["a.b", "ID", "id"]
    assert [int(v) for v in ref.get_batch([0, 49])["ID"]] == [0, 98]


def test_a_schema_naming_no_column_fails_before_spark_runs(spark, local_storage):
    schema = ydl.Schema([ydl.Field("id", np.int64), ydl.Field("nope", np.float32)])
    with pytest.raises(ydl.SchemaError, match=r"fields \['nope'\] of schema= are not columns"):
        ydl.cache_dataset(events(spark), "events", "v1", local_storage, schema=schema)


def test_spark_builds_take_no_workers_or_engine(spark, local_storage):
    with pytest.raises(ValueError, match="built by Spark, one task per partition"):
        ydl.cache_dataset(events(spark), "events", "v1", local_storage, workers=2)
    with pytest.raises(ValueError, match="built by Spark"):
        ydl.cache_dataset(events(spark), "events", "v1", local_storage, engine="ray")


# ----------------------------------------------------------------- tasks that die


def dies_once(marker: str, batches):
    """Upstream of the build's task: the first attempt of partition 1 passes on 1000 rows, then
    kills its own Python worker. Spark runs the task again."""
    from pyspark import TaskContext

    context = TaskContext.get()
    doomed = context.partitionId() == 1 and context.attemptNumber() == 0
    passed = 0
    for batch in batches:
        yield batch
        passed += batch.num_rows
        if doomed and passed >= 1000:
            Path(marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


class DiesAfterDelivering(ChunkSink):
    """A build's sink that delivers as ``sink`` does; in the first attempt of partition 1, once
    it has delivered two chunks (into the folder, or uploaded into the bucket), it notes them in
    ``marker`` and kills its Python worker: chunks of a failed attempt are in place when Spark
    runs the task again."""

    def __init__(self, sink: ChunkSink, marker: str) -> None:
        self.sink, self.marker = sink, marker
        self.delivered: list[str] = []

    def folder(self):
        return self.sink.folder()

    def deliver(self, folder, chunk):
        from pyspark import TaskContext

        delivered = self.sink.deliver(folder, chunk)
        context = TaskContext.get()
        if context.partitionId() == 1 and context.attemptNumber() == 0:
            self.delivered.append(delivered.file)
            if len(self.delivered) == 2:
                Path(self.marker).write_text(json.dumps(self.delivered))
                os.kill(os.getpid(), signal.SIGKILL)
        return delivered

    def settle(self, chunks):
        self.sink.settle(chunks)

    def abort(self):
        self.sink.abort()


def dying_after_delivery(storage, marker: Path, monkeypatch) -> None:
    make = storage.chunk_sink
    monkeypatch.setattr(
        storage,
        "chunk_sink",
        lambda *args, **kw: DiesAfterDelivering(make(*args, **kw), str(marker)),
    )


def fails_or_dawdles(batches):
    """Partition 0 fails at once (a user's bug); the others pass their rows on slowly."""
    from pyspark import TaskContext

    for batch in batches:
        if TaskContext.get().partitionId() == 0:
            raise RuntimeError("a bug in the user's own code")
        time.sleep(0.2)
        yield batch


def always_dies(batches):
    from pyspark import TaskContext

    for batch in batches:
        if TaskContext.get().partitionId() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        yield batch


@pytest.mark.crash
def test_a_task_killed_after_delivering_chunks_is_retried_without_duplicates(
    spark, local_storage, tmp_path, monkeypatch
):
    marker = tmp_path / "killed"
    dying_after_delivery(local_storage, marker, monkeypatch)
    ref = ydl.cache_dataset(events(spark), "events", "v1", local_storage, chunk_bytes=32 << 10)
    orphans = set(json.loads(marker.read_text()))
    assert len(orphans) == 2  # chunks the killed attempt had delivered
    assert_holds_events(ref, list(range(3000)))
    named = {c.file for c in ref.manifest.chunks}
    assert not written_names(ref) & orphans  # none of them published, nor left in the version
    assert version_files(local_storage, "events", "v1") == {MANIFEST_NAME, *named}
    assert len({name[:15] for name in written_names(ref)}) == 3  # one attempt per partition


@pytest.mark.crash
def test_a_task_killed_while_reading_is_retried(spark, local_storage, tmp_path):
    import functools

    marker = tmp_path / "killed"
    base = events(spark, rows=6000)
    frame = base.mapInArrow(functools.partial(dies_once, str(marker)), base.schema)
    ref = ydl.cache_dataset(frame, "events", "v1", local_storage, chunk_bytes=32 << 10)
    assert marker.exists()
    assert_holds_events(ref, list(range(6000)))
    named = {c.file for c in ref.manifest.chunks}
    assert version_files(local_storage, "events", "v1") == {MANIFEST_NAME, *named}


@pytest.mark.crash
def test_a_task_that_always_dies_fails_the_build(spark, local_storage):
    base = events(spark, rows=2000)
    frame = base.mapInArrow(always_dies, base.schema)
    with pytest.raises(ydl.WorkerDied, match=r"spark\.task\.maxFailures"):
        ydl.cache_dataset(frame, "events", "v1", local_storage)
    assert local_storage.list() == []


# ----------------------------------------------------------------- buckets


@pytest.mark.servers
def test_tasks_upload_their_chunks_into_an_s3_bucket_once(
    spark, tmp_path, s3_server, s3_bucket, monkeypatch
):
    storage = s3_server.storage(s3_bucket, "team", tmp_path / "builder")
    marker = tmp_path / "killed"
    dying_after_delivery(storage, marker, monkeypatch)  # after uploading two chunks
    ref = ydl.cache_dataset(events(spark), "events", "v1", storage, chunk_bytes=32 << 10)
    orphans = json.loads(marker.read_text())
    assert len(orphans) == 2 and not written_names(ref) & set(orphans)
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    chunk_keys = sorted(k for k in keys if k.endswith(".mdb"))
    assert chunk_keys == sorted(f"team/events/v1/{c.file}" for c in ref.manifest.chunks)
    reader = s3_server.storage(s3_bucket, "team", tmp_path / "reader")
    assert_holds_events(reader.fetch("events", "v1"), list(range(3000)))


@pytest.mark.servers
def test_a_failed_build_stops_its_tasks_before_cleaning_the_bucket(
    spark, tmp_path, s3_server, s3_bucket
):
    storage = s3_server.storage(s3_bucket, "team", tmp_path / "builder")
    base = events(spark, rows=20_000, partitions=2)
    frame = base.mapInArrow(fails_or_dawdles, base.schema)
    with pytest.raises(Exception, match="a bug in the user's own code"):
        ydl.cache_dataset(frame, "events", "v1", storage, chunk_bytes=16 << 10)
    time.sleep(3)  # a task still running would upload more chunks by now
    keys = [
        o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    ]
    assert [k for k in keys if k.endswith(".mdb")] == []


@pytest.mark.servers
def test_tasks_upload_their_chunks_into_a_gcs_bucket(
    spark, tmp_path, gcs_server, gcs_bucket, monkeypatch
):
    for name, value in gcs_server.env().items():
        monkeypatch.setenv(name, value)  # this process, and each Spark task's worker:
        monkeypatch.setitem(spark.sparkContext.environment, name, value)
    storage = ydl.GCSStorage(gcs_bucket, "team", local_cache=tmp_path / "builder")
    ref = ydl.cache_dataset(events(spark, rows=1000), "events", "v1", storage)
    blobs = [b.name for b in gcs_server.client().list_blobs(gcs_bucket)]
    assert sorted(b for b in blobs if b.endswith(".mdb")) == sorted(
        f"team/events/v1/{c.file}" for c in ref.manifest.chunks
    )
    reader = ydl.GCSStorage(gcs_bucket, "team", local_cache=tmp_path / "reader")
    assert_holds_events(reader.fetch("events", "v1"), list(range(1000)))
