"""Parquet sources on S3 and GCS (real servers, tests/servers.py), read through pyarrow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.remote_helpers import filesystem_of, gcs_filesystem, s3_filesystem

import yogadl_plus as ydl

pytestmark = pytest.mark.servers


def table(start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
            "x": pa.array(
                list(np.arange(start, start + n, dtype=np.float32).reshape(-1, 1) * [1, 2])
            ),
        }
    )


def write_parts(filesystem: Any, base: str) -> None:
    for part in range(3):
        with filesystem.open_output_stream(f"{base}/part-{part}.parquet") as f:
            pq.write_table(table(part * 100, 100), f)
    with filesystem.open_output_stream(f"{base}/_SUCCESS") as f:
        f.write(b"")


@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_parquet_from_bucket_urls_builds_directly(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server = request.getfixturevalue("s3_server" if kind == "s3" else "gcs_server")
    bucket = server.make_bucket()
    filesystem = s3_filesystem(server) if kind == "s3" else gcs_filesystem(server)
    write_parts(filesystem, f"{bucket}/tables/t1")
    storage = ydl.LocalStorage(tmp_path / "store")

    whole = ydl.sources.ParquetSource(f"{kind}://{bucket}/tables/t1", filesystem=filesystem)
    ref = ydl.cache_dataset(whole, "t", "1", storage)
    assert [int(i) for i in ref.get_batch(range(300), "id")["id"]] == list(range(300))
    np.testing.assert_array_equal(ref[150]["x"], [150, 300])
    assert ref.manifest.source_kind == "parquet"
    assert ref.manifest.source_fingerprint == whole.fingerprint()

    glob = ydl.sources.ParquetSource(
        f"{kind}://{bucket}/tables/t1/part-[02].parquet", filesystem=filesystem, columns=["id"]
    )
    assert [int(r["id"]) for r in glob.records()][::100] == [0, 200]

    with pytest.raises(ydl.YogaError, match="does not exist"):
        ydl.sources.ParquetSource(f"{kind}://{bucket}/tables/nothing", filesystem=filesystem)


def test_s3_parquet_url_uses_the_standard_chain(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No filesystem=: pyarrow's S3 picks endpoint and keys up from the environment."""
    bucket = s3_server.make_bucket()
    write_parts(s3_filesystem(s3_server), f"{bucket}/t")
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    ref = ydl.cache_dataset(f"s3://{bucket}/t", "t", "1", ydl.LocalStorage(tmp_path / "s"))
    assert len(ref) == 300


def test_mixed_filesystems_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ydl.YogaError, match="one filesystem"):
        ydl.sources.ParquetSource(["s3://b/x.parquet", str(tmp_path / "y.parquet")])


# --------------------------------------------------------------------------- hive partitions

DATA = Path(__file__).parent / "data"


def rows_of(ref: ydl.DataRef) -> list[dict[str, Any]]:
    batch = ref.get_batch(list(range(len(ref))))
    return [{k: v[i] for k, v in batch.items()} for i in range(len(ref))]


@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_hive_partitioned_parquet_in_a_bucket_keeps_its_partition_columns(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    filesystem, bucket = filesystem_of(kind, request)
    n = 90
    data = pa.table(
        {
            "x": np.arange(n, dtype=np.float64),
            "day": pa.array([None if i % 10 == 9 else i % 3 for i in range(n)], pa.int64()),
            "tag": [["a", "b/c"][i % 2] for i in range(n)],
        }
    )
    root = f"{bucket}/hive"
    pq.write_to_dataset(
        data, root, partition_cols=["day", "tag"], filesystem=filesystem, row_group_size=8
    )
    with filesystem.open_output_stream(f"{root}/_SUCCESS") as f:
        f.write(b"")
    with filesystem.open_output_stream(f"{root}/_temporary/0/day=1/tag=a/part-0.parquet") as f:
        pq.write_table(pa.table({"x": [-1.0]}), f)  # a failed attempt's leftover: no data

    source = ydl.sources.ParquetSource(f"{kind}://{root}", filesystem=filesystem)
    storage = ydl.LocalStorage(tmp_path / "store")
    serial = ydl.cache_dataset(source, "hive", "serial", storage, progress=False)
    parallel = ydl.cache_dataset(source, "hive", "parallel", storage, progress=False, workers=2)
    assert serial.schema.names == ("x", "day", "tag")
    assert serial.schema["day"].dtype == np.int32 and serial.schema["day"].nullable
    got = rows_of(serial)
    assert got == rows_of(parallel)
    expected = {r["x"]: (r["day"], r["tag"]) for r in data.to_pylist()}
    assert {r["x"]: (r["day"], r["tag"]) for r in got} == expected and len(got) == n
    assert serial.manifest.source_fingerprint == source.fingerprint()


@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_a_partitioned_petastorm_store_in_a_bucket(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The store Petastorm and Spark's partitionBy wrote (tests/data), uploaded as it is."""
    filesystem, bucket = filesystem_of(kind, request)
    store = DATA / "petastorm_partitioned"
    for path in store.rglob("*"):
        if path.is_file():
            with filesystem.open_output_stream(f"{bucket}/p/{path.relative_to(store)}") as f:
                f.write(path.read_bytes())
    with np.load(DATA / "petastorm_partitioned_expected.npz", allow_pickle=False) as saved:
        expected = {name: saved[name] for name in saved.files}

    source = ydl.sources.PetastormSource(f"{kind}://{bucket}/p", filesystem=filesystem)
    ref = ydl.cache_dataset(source, "p", "v1", ydl.LocalStorage(tmp_path / "s"), workers=2)
    assert ref.manifest.source_kind == "petastorm" and len(ref) == 24
    rows = sorted(rows_of(ref), key=lambda r: r["id"])
    assert [r["station"] for r in rows] == expected["station"].tolist()
    assert [-1 if r["day"] is None else r["day"] for r in rows] == expected["day"].tolist()
    assert np.array_equal(np.stack([r["matrix"] for r in rows]), expected["matrix"])
