"""Cache a Spark DataFrame: Spark's executors write the cache, one task per partition, and
the version then streams like any other (shuffled, batched, resumable), without Spark.

Run: python examples/spark_build.py [STORAGE_DIR]   (needs pip install 'yogadl_plus[spark]'
and Java 17 or later)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

import yogadl_plus as ydl

try:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
except ModuleNotFoundError as missing:  # say which pip install brings it
    raise SystemExit(ydl.missing_extra(missing, "examples/spark_build.py")) from None


def main(folder: str) -> None:
    storage = ydl.LocalStorage(folder)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local Spark: it stays on loopback
    # Spark's Python workers run $PYSPARK_PYTHON, else the `python3` on the PATH: this one,
    # whose packages they need, even where its virtual environment is not activated.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("yogadl_plus example")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.pyspark.python", sys.executable)  # executors run this Python
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    clicks = (
        spark.range(0, 50_000, numPartitions=4)
        .withColumn("user", (F.col("id") * 7919 % 1000).cast("int"))
        .withColumn("embedding", F.expr("transform(sequence(0, 15), k -> float(sin(id + k)))"))
        .withColumn("clicked", F.col("id") % 3 == 0)
        .orderBy("user", "id")  # sorted by user: each user's clicks are contiguous
    )
    schema = ydl.Schema(
        [
            ydl.Field("id", np.int64),
            ydl.Field("user", np.int32),
            ydl.Field("embedding", np.float32, (16,)),  # Spark arrays have no fixed length
            ydl.Field("clicked", np.bool_),
        ]
    )
    started = time.perf_counter()
    ref = ydl.cache_dataset(clicks, "clicks", "v1", storage, schema=schema)
    print(f"cached {len(ref)} rows in {len(ref.manifest.chunks)} chunks by Spark tasks, "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    spark.stop()  # the cache needs no Spark from here on

    users = ref.get_batch(list(range(len(ref))))["user"]
    assert np.all(np.diff(users) >= 0), "the cache keeps the DataFrame's order"
    stream = ref.stream(shuffle=True, shuffle_seed=0, batch_size=1024, fields=["embedding"])
    first = next(iter(stream))
    print(f"a shuffled batch: {first['embedding'].shape} {first['embedding'].dtype}; "
          f"resume at offset {stream.offset}")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # a temporary folder, removed at the end
        with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
            main(folder)
