"""Petastorm 0.13.1 baseline for the selective-predicate benchmark (bench_boundary), run in the
petastorm side venv, from the repository root:

    .baselines/petastorm/bin/python -m bench.baselines.petastorm_boundary \
        [--rows 8000] [--big-bytes 100000] [--workdir DIR] [--json OUT] [--repeats 3] [--rebuild]

Data (N rows): ``id`` int64 = row number, ``key`` int64 = id % 100 (``in_set([0], 'key')`` passes
exactly 1%), ``big`` = B uint8 bytes, ``np.random.default_rng(id).bytes(B)`` (random, so it does
not compress). Two copies of the same rows are written under ``--workdir``:

- ``petastorm_ds/``: a Petastorm dataset made with ``materialize_dataset`` and Spark in local mode
  (Unischema: ``id`` and ``key`` ScalarCodec(LongType), ``big`` NdarrayCodec of shape (B,) uint8;
  32 MB row groups);
- ``plain.parquet``: one plain Parquet file written with pyarrow (columns ``id`` int64, ``key``
  int64, ``big`` binary holding the B raw bytes, all non-nullable) for the yogadl_plus side.

Both are reused when ``--workdir`` already holds them for the same N and B (``--rebuild`` forces a
new build). Then, after one untimed full read (which also checks every ``big`` value), it times
``make_reader(..., reader_pool_type='thread', num_epochs=1)`` with 1 and 2 workers: a full scan,
``predicate=in_set([0], 'key')``, ``shuffle_row_drop_partitions=4``, ``shuffle_row_groups``
False/True. Each figure is the best (minimum time) of ``--repeats`` runs; a run times
``make_reader`` construction plus iterating the reader to exhaustion (``stop()``/``join()`` are
outside the timing). Prints one JSON object on the last line of stdout (and to ``--json``).
See bench/baselines/petastorm_notes.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import shutil
import sys
import time
from typing import Any

# Offline and quiet Spark; the Python workers Spark starts must be this venv's python.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")

import numpy as np

from bench.baselines.spark_local import local_spark
from bench.baselines.warning_counts import collect_warnings
from bench.harness import warm

ROW_GROUP_MB = 32
PLAIN_ROWS_PER_GROUP = 256  # 25.6 MB row groups at B = 100 KB, close to the Petastorm side
PASS_KEY = 0
KEY_MOD = 100
DROP_PARTITIONS = 4


def big_value(i: int, nbytes: int) -> np.ndarray:
    """The ``big`` field of row ``i``: B random bytes seeded by the row number."""
    return np.frombuffer(np.random.default_rng(i).bytes(nbytes), dtype=np.uint8)


def make_schema(nbytes: int) -> Any:
    from petastorm.codecs import NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import LongType

    return Unischema(
        "SelectiveBench",
        [
            UnischemaField("id", np.int64, (), ScalarCodec(LongType()), False),
            UnischemaField("key", np.int64, (), ScalarCodec(LongType()), False),
            UnischemaField("big", np.uint8, (nbytes,), NdarrayCodec(), False),
        ],
    )


def _quiet_logging() -> None:
    for name in ("py4j", "pyspark", "petastorm", "pyarrow"):
        logging.getLogger(name).setLevel(logging.ERROR)


# --------------------------------------------------------------------------- building


def materialize_petastorm(path: str, n: int, nbytes: int, workdir: str, partitions: int) -> float:
    """Writes the Petastorm dataset with Spark (local[2]); returns the seconds it took."""
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import dict_to_spark_row

    schema = make_schema(nbytes)
    t0 = time.perf_counter()
    with local_spark("petastorm-baseline", workdir) as spark:
        url = "file://" + os.path.abspath(path)

        def row(i: int) -> Any:
            return dict_to_spark_row(
                schema,
                {"id": np.int64(i), "key": np.int64(i % KEY_MOD), "big": big_value(i, nbytes)},
            )

        with materialize_dataset(spark, url, schema, ROW_GROUP_MB):
            rdd = spark.sparkContext.parallelize(range(n), partitions).map(row)
            (
                spark.createDataFrame(rdd, schema.as_spark_schema())
                .write.mode("overwrite")
                .option("compression", "snappy")
                .parquet(url)
            )
    return time.perf_counter() - t0


def write_plain_parquet(path: str, n: int, nbytes: int) -> float:
    """The same rows as one plain Parquet file (pyarrow, no Petastorm encoding)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("key", pa.int64(), nullable=False),
            pa.field("big", pa.binary(), nullable=False),
        ]
    )
    t0 = time.perf_counter()
    tmp = path + ".tmp"
    with pq.ParquetWriter(tmp, schema, compression="snappy") as writer:
        for lo in range(0, n, PLAIN_ROWS_PER_GROUP):
            ids = np.arange(lo, min(n, lo + PLAIN_ROWS_PER_GROUP), dtype=np.int64)
            table = pa.Table.from_arrays(
                [
                    pa.array(ids),
                    pa.array(ids % KEY_MOD),
                    pa.array([big_value(int(i), nbytes).tobytes() for i in ids], pa.binary()),
                ],
                schema=schema,
            )
            writer.write_table(table, row_group_size=PLAIN_ROWS_PER_GROUP)
    os.replace(tmp, path)
    return time.perf_counter() - t0


def dir_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def row_groups(ds_path: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    files = sorted(os.path.join(ds_path, f) for f in os.listdir(ds_path) if f.endswith(".parquet"))
    rows = [
        pq.ParquetFile(f).metadata.row_group(i).num_rows
        for f in files
        for i in range(pq.ParquetFile(f).metadata.num_row_groups)
    ]
    return {
        "files": len(files),
        "row_groups": len(rows),
        "rows_per_group_min": min(rows),
        "rows_per_group_max": max(rows),
    }


# --------------------------------------------------------------------------- reading


def read_once(url: str, verify_nbytes: int = 0, **kwargs: Any) -> tuple[float, int, int]:
    """One make_reader pass; returns (seconds to the last record, records, distinct ids)."""
    from petastorm import make_reader

    gc.collect()
    t0 = time.perf_counter()
    reader = make_reader(url, reader_pool_type="thread", num_epochs=1, **kwargs)
    count = 0
    ids = set()
    try:
        for row in reader:
            count += 1
            ids.add(int(row.id))
            if verify_nbytes:
                assert int(row.key) == int(row.id) % KEY_MOD
                assert np.array_equal(row.big, big_value(int(row.id), verify_nbytes)), row.id
        elapsed = time.perf_counter() - t0
    finally:
        reader.stop()
        reader.join()
    return elapsed, count, len(ids)


def measure(url: str, n: int, repeats: int, **kwargs: Any) -> dict[str, Any]:
    times = []
    counts = set()
    distinct = set()
    for _ in range(repeats):
        t, c, d = read_once(url, **kwargs)
        times.append(t)
        counts.add(c)
        distinct.add(d)
    assert len(counts) == 1, counts
    best = min(times)
    yielded = counts.pop()
    return {
        "best_s": best,
        "times_s": times,
        "records_yielded": yielded,
        "distinct_ids_yielded": distinct.pop(),
        "rows_scanned_per_s": n / best,
        "records_yielded_per_s": yielded / best,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8000, help="N (default 8000: 800 MB at 100 KB)")
    parser.add_argument("--big-bytes", type=int, default=100_000)
    parser.add_argument("--workdir", default="/tmp/ydl_petastorm_bench")
    parser.add_argument("--json", default=None, help="also write the JSON here")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="workers_count values (default 1,2)")
    parser.add_argument("--spark-partitions", type=int, default=2)
    parser.add_argument("--rebuild", action="store_true", help="rebuild even if the data exists")
    parser.add_argument("--no-verify", action="store_true", help="skip checking every big value")
    args = parser.parse_args()
    n, nbytes = args.rows, args.big_bytes
    workers_list = [int(w) for w in args.workers.split(",")]
    load_at_start = os.getloadavg()
    _quiet_logging()

    seen_warnings = collect_warnings()  # into the JSON instead of flooding stderr

    import petastorm
    import pyarrow
    import pyspark

    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    ds_path = os.path.join(workdir, "petastorm_ds")
    plain_path = os.path.join(workdir, "plain.parquet")
    marker = os.path.join(workdir, "built.json")
    spec = {"rows": n, "big_bytes": nbytes, "format": 1}
    reused = False
    materialize_s = plain_s = None
    if not args.rebuild and os.path.exists(marker) and os.path.exists(plain_path):
        with open(marker) as f:
            reused = json.load(f) == spec
    if not reused:
        for p in (ds_path, plain_path, marker):
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif os.path.exists(p):
                os.remove(p)
        materialize_s = materialize_petastorm(ds_path, n, nbytes, workdir, args.spark_partitions)
        plain_s = write_plain_parquet(plain_path, n, nbytes)
        with open(marker, "w") as f:
            json.dump(spec, f)

    url = "file://" + ds_path
    warm(ds_path)
    warm(plain_path)

    # Untimed warm-up: one full read, every value checked against the generator (the plain
    # Parquet file is written from the same generator, so both copies hold the same rows).
    t_warm, c_warm, d_warm = read_once(
        url,
        verify_nbytes=0 if args.no_verify else nbytes,
        workers_count=2,
        shuffle_row_groups=False,
    )
    assert c_warm == n and d_warm == n, (c_warm, d_warm, n)

    from petastorm.predicates import in_set

    results: dict[str, Any] = {}
    for w in workers_list:
        common = {"workers_count": w, "seed": 0}
        r: dict[str, Any] = {}
        # a. full scan, every field decoded (shuffle_row_groups=True is make_reader's default)
        r["full_scan"] = measure(url, n, args.repeats, shuffle_row_groups=True, **common)
        # b. 1% predicate on key; big is decoded only for the passing rows
        r["predicate_1pct"] = measure(
            url,
            n,
            args.repeats,
            shuffle_row_groups=True,
            predicate=in_set([PASS_KEY], "key"),
            **common,
        )
        # b'. for information: the same predicate with big left out of schema_fields
        r["predicate_1pct_without_big"] = measure(
            url,
            n,
            args.repeats,
            shuffle_row_groups=True,
            predicate=in_set([PASS_KEY], "key"),
            schema_fields=["id", "key"],
            **common,
        )
        # c. shuffle_row_drop_partitions=4: each row group is ventilated 4 times, each read
        #    keeps 1/4 of its rows; one reader still yields the whole epoch
        r["drop_partitions_4"] = measure(
            url,
            n,
            args.repeats,
            shuffle_row_groups=True,
            shuffle_row_drop_partitions=DROP_PARTITIONS,
            **common,
        )
        # d. row-group order, for information
        r["full_scan_shuffle_row_groups_false"] = measure(
            url, n, args.repeats, shuffle_row_groups=False, **common
        )
        results[f"workers_{w}"] = r

    n_pass = len(range(PASS_KEY, n, KEY_MOD))
    for w_key, r in results.items():
        assert r["full_scan"]["records_yielded"] == n, w_key
        assert r["predicate_1pct"]["records_yielded"] == n_pass, w_key
        r["full_scan_over_predicate_time"] = (
            r["full_scan"]["best_s"] / r["predicate_1pct"]["best_s"]
        )

    out = {
        "n": n,
        "big_bytes": nbytes,
        "pass_fraction": n_pass / n,
        "repeats": args.repeats,
        "petastorm_version": petastorm.__version__,
        "pyarrow_version": pyarrow.__version__,
        "numpy_version": np.__version__,
        "pyspark_version": pyspark.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "reused_existing_data": reused,
        "materialize_s": materialize_s,
        "plain_parquet_write_s": plain_s,
        "petastorm_dataset_path": ds_path,
        "petastorm_dataset_url": url,
        "petastorm_dataset_bytes": dir_bytes(ds_path),
        "petastorm_layout": row_groups(ds_path),
        "plain_parquet_path": plain_path,
        "plain_parquet_bytes": os.path.getsize(plain_path),
        "plain_parquet_layout": {
            "columns": {"id": "int64", "key": "int64 (= id % 100)", "big": "binary (B bytes)"},
            "rows_per_row_group": PLAIN_ROWS_PER_GROUP,
            "compression": "snappy",
            "big_value": "np.random.default_rng(id).bytes(big_bytes)",
        },
        "warmup_verified_read_s": t_warm,
        "results": results,
        "warnings_seen": seen_warnings,
    }
    text = json.dumps(out)
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
