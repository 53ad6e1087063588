"""Petastorm 0.13.1 PyTorch baseline of bench_frameworks, run in the petastorm side venv, from the
repository root:

    .baselines/petastorm/bin/python -m bench.baselines.petastorm_torch --x X.npy --label L.npy \
        --workdir DIR [--repeats 3] [--batch-reader-workers 1,2] [--reader-workers 2] \
        [--shuffle-queue 10000] [--keep]

Data: the N records ``{"x": float32[64], "label": int64}`` of X.npy / L.npy, written twice under
``DIR`` (which is deleted at the end unless ``--keep``):

- ``petastorm_ds/``: a Petastorm dataset (``materialize_dataset``, Spark local[2]): Unischema
  ``x`` = ``NdarrayCodec`` float32 (64,), ``label`` = ``ScalarCodec(LongType())``; 1 MB row
  groups (``row_group_size_mb=1``), snappy. Read with ``make_reader`` +
  ``petastorm.pytorch.DataLoader``.
- ``plain.parquet``: plain Parquet written with pyarrow: ``x`` list<float32> (64 values),
  ``label`` int64, 4096 rows (~1 MB) per row group, snappy. Read with ``make_batch_reader`` +
  ``petastorm.pytorch.BatchedDataLoader``.

Both paths are shuffled as far as Petastorm allows: ``shuffle_row_groups=True`` (row-group
order), ``shuffle_rows=True`` (rows within a row group, in the worker) and
``shuffling_queue_capacity=Q`` (a row-level shuffling buffer in the loader), ``seed=0``;
``batch_size=256``; ``reader_pool_type='thread'`` with ``workers_count`` W. A timed run is the
reader's and the loader's construction plus iterating the loader to its end (batches of torch
tensors, x (256, 64) float32 and label (256,) int64); ``stop()``/``join()`` come after the timer.
The timed loops only count records, as on the yogadl_plus side. Each make_batch_reader
configuration first gets one untimed epoch that checks every batch (dtypes and shapes; N records;
the sums of the labels and of x equal those of the arrays); make_reader's would cost ~10 s at
10^5, so its timed runs do that check instead (< 0.5% of a run). Each figure is the best
(minimum time) of ``--repeats`` runs. Prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

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
from bench.harness import arrays_parser, warm

BATCH = 256
PETASTORM_ROW_GROUP_MB = 1
PLAIN_ROWS_PER_GROUP = 4096  # ~1 MB row groups, like the Petastorm side


def make_schema() -> Any:
    from petastorm.codecs import NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import LongType

    return Unischema(
        "FrameworksBench",
        [
            UnischemaField("x", np.float32, (64,), NdarrayCodec(), False),
            UnischemaField("label", np.int64, (), ScalarCodec(LongType()), False),
        ],
    )


def materialize_petastorm(path: str, x_path: str, label_path: str, workdir: str) -> float:
    """Writes the Petastorm dataset with Spark (local[2]); returns the seconds it took."""
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import dict_to_spark_row

    schema = make_schema()
    n = len(np.load(label_path, mmap_mode="r"))
    t0 = time.perf_counter()
    with local_spark("petastorm-torch-baseline", workdir) as spark:
        url = "file://" + os.path.abspath(path)

        def rows(part: Any) -> Any:
            # Each Spark task maps the arrays from the .npy files (same machine) instead of
            # receiving them pickled in the closure.
            xs = np.load(x_path, mmap_mode="r")
            labels = np.load(label_path, mmap_mode="r")
            for i in part:
                yield dict_to_spark_row(
                    schema, {"x": np.array(xs[i], np.float32), "label": np.int64(labels[i])}
                )

        with materialize_dataset(spark, url, schema, PETASTORM_ROW_GROUP_MB):
            rdd = spark.sparkContext.parallelize(range(n), 2).mapPartitions(rows)
            (
                spark.createDataFrame(rdd, schema.as_spark_schema())
                .write.mode("overwrite")
                .option("compression", "snappy")
                .parquet(url)
            )
    return time.perf_counter() - t0


def write_plain_parquet(path: str, x: np.ndarray, label: np.ndarray) -> float:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            pa.field("x", pa.list_(pa.float32()), nullable=False),
            pa.field("label", pa.int64(), nullable=False),
        ]
    )
    t0 = time.perf_counter()
    n = len(label)
    offsets = pa.array(np.arange(0, 64 * n + 1, 64, dtype=np.int32))
    xs = pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)))
    table = pa.Table.from_arrays([xs, pa.array(label)], schema=schema)
    pq.write_table(table, path, row_group_size=PLAIN_ROWS_PER_GROUP, compression="snappy")
    return time.perf_counter() - t0


def layout(path: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".parquet"))
    else:
        files = [path]
    rows = [
        pq.ParquetFile(f).metadata.row_group(i).num_rows
        for f in files
        for i in range(pq.ParquetFile(f).metadata.num_row_groups)
    ]
    size = (
        sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        if os.path.isdir(path)
        else os.path.getsize(path)
    )
    return {
        "files": len(files),
        "row_groups": len(rows),
        "rows_per_group_min": min(rows),
        "rows_per_group_max": max(rows),
        "bytes": size,
    }


# --------------------------------------------------------------------------- reading


def one_epoch(
    kind: str, url: str, workers: int, queue: int, check: tuple[int, int, float] | None
) -> float:
    """Constructs reader + loader and iterates one epoch; returns the seconds to the last batch
    (``stop()``/``join()`` come after). With ``check`` = (N, sum of labels, sum of x), every
    batch is checked (dtypes, shapes, the sums); without it the loop only counts records."""
    from petastorm import make_batch_reader, make_reader
    from petastorm.pytorch import BatchedDataLoader, DataLoader

    common = {
        "reader_pool_type": "thread",
        "workers_count": workers,
        "num_epochs": 1,
        "seed": 0,
        "shuffle_row_groups": True,
        "shuffle_rows": True,
    }
    gc.collect()
    t0 = time.perf_counter()
    if kind == "reader":
        reader = make_reader(url, **common)
        loader: Any = DataLoader(reader, batch_size=BATCH, shuffling_queue_capacity=queue)
    else:
        reader = make_batch_reader(url, **common)
        loader = BatchedDataLoader(reader, batch_size=BATCH, shuffling_queue_capacity=queue)
    count, label_sum, x_sum = 0, 0, 0.0
    try:
        if check is None:
            for batch in loader:  # as on the yogadl_plus side: count records, nothing else
                count += len(batch["label"])
        else:
            for batch in loader:
                xb, lb = batch["x"], batch["label"]
                assert xb.dtype == torch.float32 and tuple(xb.shape[1:]) == (64,), xb.shape
                assert lb.dtype == torch.int64 and lb.shape[0] == xb.shape[0]
                count += len(lb)
                label_sum += int(lb.sum())
                x_sum += float(xb.double().sum())
        elapsed = time.perf_counter() - t0
    finally:
        reader.stop()
        reader.join()
    assert count == N_RECORDS, (kind, count, N_RECORDS)
    if check is not None:
        _, want_label, want_x = check
        assert label_sum == want_label, (kind, label_sum, want_label)
        assert abs(x_sum - want_x) < 1e-6 * max(1.0, abs(want_x)) + 1e-3, (kind, x_sum, want_x)
    return elapsed


N_RECORDS = 0
torch: Any = None


def main() -> None:
    global N_RECORDS, torch
    parser = arrays_parser(__doc__.split("\n")[0], "x", "label")
    parser.add_argument("--batch-reader-workers", default="1,2", help="workers_count values")
    parser.add_argument(
        "--reader-workers",
        default="2",
        help="workers_count values for make_reader (default 2: it runs at ~6k rows/s, and 1 "
        "worker is slower still)",
    )
    parser.add_argument(
        "--shuffle-queue", type=int, default=10_000, help="shuffling_queue_capacity"
    )
    parser.add_argument("--keep", action="store_true", help="do not delete --workdir at the end")
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    for name in ("py4j", "pyspark", "petastorm", "pyarrow"):
        logging.getLogger(name).setLevel(logging.ERROR)

    seen_warnings = collect_warnings()  # into the JSON instead of flooding stderr

    import petastorm
    import pyarrow
    import torch as torch_module

    torch = torch_module

    x = np.load(args.x)
    label = np.load(args.label)
    n = N_RECORDS = len(label)
    check = (n, int(label.sum()), float(x.astype(np.float64).sum()))
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    try:
        ds_path = os.path.join(workdir, "petastorm_ds")
        plain_path = os.path.join(workdir, "plain.parquet")
        materialize_s = materialize_petastorm(ds_path, args.x, args.label, workdir)
        plain_s = write_plain_parquet(plain_path, x, label)
        warm(ds_path)
        warm(plain_path)
        urls = {"reader": "file://" + ds_path, "batch_reader": "file://" + plain_path}
        workers = {"batch_reader": args.batch_reader_workers, "reader": args.reader_workers}
        results: dict[str, Any] = {}
        for kind, url in urls.items():
            for w in [int(w) for w in workers[kind].split(",") if w.strip()]:
                if kind == "batch_reader":
                    # Untimed, checked warm-up; then count-only timed runs.
                    one_epoch(kind, url, w, args.shuffle_queue, check)
                    timed_check = None
                else:
                    # make_reader runs at ~10k rows/s: an untimed epoch would cost ~10 s, and
                    # the check costs < 0.5% of a run, so its timed runs are checked instead.
                    timed_check = check
                times = [
                    one_epoch(kind, url, w, args.shuffle_queue, timed_check)
                    for _ in range(args.repeats)
                ]
                results[f"{kind}_w{w}"] = {"times_s": times, "best_s": min(times)}
        out = {
            "n": n,
            "batch_size": BATCH,
            "shuffling_queue_capacity": args.shuffle_queue,
            "reader_args": "reader_pool_type='thread', num_epochs=1, seed=0, "
            "shuffle_row_groups=True, shuffle_rows=True",
            "repeats": args.repeats,
            "results": results,
            "materialize_s": materialize_s,
            "plain_parquet_write_s": plain_s,
            "petastorm_layout": layout(ds_path),
            "plain_parquet_layout": layout(plain_path),
            "petastorm_version": petastorm.__version__,
            "pyarrow_version": pyarrow.__version__,
            "torch_version": torch.__version__,
            "numpy_version": np.__version__,
            "python": platform.python_version(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": os.getloadavg(),
            "warnings_seen": seen_warnings,
        }
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
