"""Spark builds: cache_dataset of a Spark DataFrame (one Spark task per partition writes its
chunks) against Spark's own df.write.parquet of the same DataFrame (the baseline), the floor of
handing its rows to Python workers through Arrow (mapInArrow), and Petastorm 0.13.1's
make_spark_converter (which materializes a DataFrame as Parquet for training), in one run, on
Spark local[2]. Prints a markdown table.

    python bench/bench_spark.py                   # 1M rows in 8 partitions, best of 5 (~2.5 min)
    python bench/bench_spark.py --quick           # 200,000 rows, best of 2 (~1 min)
    python bench/bench_spark.py --rows 500000 --repeats 3 --no-petastorm --json /tmp/spark.json

The DataFrame: ``rows`` rows of {id: long, x: array<float> of 64, label: int, name: string},
made by ``spark.range(rows, numPartitions=8)`` and Spark expressions (x holds pseudo-random
floats from ``hash(id, k)``, which compress as badly as real features; label = id % 10;
name = "item-<id>"). It is ``.cache()``d and counted before any timing. Why: building the
rows (64 hashes a row) costs more than some of the writes measured, and a source read from
Parquet files would add a decoder every method pays alike; from Spark's in-memory cache, every
row times the same thing, reading the same cached partitions in 8 tasks on 2 task threads and
writing them somewhere, and the differences between rows are the writers'.

The rows: Spark's own ``df.write.parquet`` (snappy, its default; the baseline, 1.00x);
``ydl.cache_dataset(df, ...)`` into a ``LocalStorage``, a fresh version each time, as is (Spark
declares x a variable-length array) and with ``schema=`` making x float32[64];
``df.mapInArrow(count rows).collect()``, the floor of moving the rows into Python workers as
Arrow batches, which any Python writer on Spark pays; and Petastorm's ``make_spark_converter``
(uncompressed Parquet with 32 MB row groups, its defaults, then a Spark count of what it wrote).
Petastorm runs in its side venv (.baselines/petastorm, made by bench/baselines/venvs.sh)
as a subprocess of this script (``--side-petastorm``), with its own Spark of the same
configuration (bench/_spark_local.py) that makes, caches and counts the same DataFrame; it runs
after this process's Spark is stopped. Without the venv its row says why it was not measured.

Each method is timed ``--repeats`` times, the methods taking turns (a slow spell of the machine
hits all of them; the first round also pays the JVM's warm-up and the start of the Python
workers), into a fresh folder each time (measured and deleted outside the timing); the table
shows the best. records/s = rows / seconds; "data MB/s" = the bytes of the values
(8 + 64*4 + 4 + len(name) per row) / seconds; "written MB": what the method left on disk.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
PETASTORM_PYTHON = os.path.join(ROOT, ".baselines", "petastorm", "bin", "python")
VENV_HINT = "make it with: bash bench/baselines/venvs.sh .baselines"

# Spark's Python workers must be this interpreter (this venv's, on the Petastorm side).
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from _spark_local import local_spark  # noqa: E402


def make_frame(spark: Any, rows: int, partitions: int) -> Any:
    """The benchmark's DataFrame, cached in memory and counted (so computed) once."""
    from pyspark.sql import functions as F

    frame = spark.range(0, rows, numPartitions=partitions).select(
        "id",
        F.array(*[(F.hash("id", F.lit(k)) / 2147483648.0).cast("float") for k in range(64)]).alias(
            "x"
        ),
        (F.col("id") % 10).cast("int").alias("label"),
        F.format_string("item-%d", "id").alias("name"),
    )
    assert frame.schema["x"].dataType.simpleString() == "array<float>"
    frame = frame.cache()
    counted = frame.count()
    assert counted == rows, (counted, rows)
    return frame


def data_bytes(frame: Any, rows: int) -> int:
    """The bytes of the values: id, 64 floats and label per row, plus every name."""
    from pyspark.sql import functions as F

    names = frame.agg(F.sum(F.length("name"))).first()[0]
    return rows * (8 + 64 * 4 + 4) + int(names)


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = run()
    return time.perf_counter() - started, result


def count_rows(batches: Iterator[Any]) -> Iterator[Any]:
    """In a Spark task: take the partition's Arrow batches and count their rows (the floor)."""
    import pyarrow as pa

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_arrays([pa.array([rows], pa.int64())], names=["rows"])


def petastorm_side(args: argparse.Namespace) -> None:
    """In the Petastorm venv: time make_spark_converter(df) on the same DataFrame; print JSON."""
    import logging

    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    for name in ("py4j", "pyspark", "petastorm", "pyarrow"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.makedirs(args.workdir, exist_ok=True)
    with local_spark("yogadl_plus bench_spark", args.workdir) as spark:
        frame = make_frame(spark, args.rows, args.partitions)
        parent = os.path.join(args.workdir, "converter")
        spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{parent}")
        times, written = [], 0
        for _ in range(args.repeats):
            seconds, converter = timed(lambda: make_spark_converter(frame))
            assert len(converter) == args.rows, (len(converter), args.rows)
            times.append(seconds)
            written = folder_bytes(parent)
            converter.delete()  # also forgets it: the next call materializes again
    import petastorm
    import pyspark

    print(
        json.dumps(
            {
                "times": times,
                "written_bytes": written,
                "versions": {"petastorm": petastorm.__version__, "pyspark": pyspark.__version__},
            }
        )
    )


def run_petastorm(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    """make_spark_converter in the side venv: its timings, or why there are none."""
    if args.no_petastorm:
        return {"skipped": "--no-petastorm"}
    if not os.path.exists(args.petastorm_python):
        return {"skipped": f"no {args.petastorm_python} ({VENV_HINT})"}
    command = [
        args.petastorm_python,
        os.path.abspath(__file__),
        "--side-petastorm",
        "--rows",
        str(args.rows),
        "--partitions",
        str(args.partitions),
        "--repeats",
        str(args.repeats),
        "--workdir",
        os.path.join(workdir, "petastorm"),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr + done.stdout).strip().splitlines() or ["?"]
        errors = [line for line in lines if "Error" in line or "Exception" in line]
        return {"skipped": f"the side run failed ({(errors or lines)[-1].strip()[:200]})"}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200,000 rows, best of 2")
    parser.add_argument("--no-petastorm", action="store_true")
    parser.add_argument("--petastorm-python", default=PETASTORM_PYTHON, help="the side venv's")
    parser.add_argument("--no-floor", action="store_true", help="skip the mapInArrow row")
    parser.add_argument("--tmp", help="parent of the temporary folder (default: the system's)")
    parser.add_argument("--json", help="also write every timing here")
    parser.add_argument("--side-petastorm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats = 200_000, 2
    if args.side_petastorm:
        petastorm_side(args)
        return

    import numpy as np
    import pyspark
    from bench_foundation import machine

    import yogadl_plus as ydl

    # pyspark's own, on newer pandas than it has tried (printed once per mapInArrow)
    warnings.filterwarnings("ignore", "PySpark does not yet fully support", FutureWarning)

    info = machine()  # its load average: at the start
    tmp = tempfile.mkdtemp(prefix="yogadl_plus_bench_spark_", dir=args.tmp)
    try:
        storage = ydl.LocalStorage(os.path.join(tmp, "store"))
        times: dict[str, list[float]] = {}
        written: dict[str, int] = {}
        with local_spark("yogadl_plus bench_spark", tmp) as spark:
            frame = make_frame(spark, args.rows, args.partitions)
            megabytes = data_bytes(frame, args.rows) / 1e6

            def parquet(i: int) -> str:
                path = os.path.join(tmp, f"parquet-{i}")
                frame.write.parquet(path)
                return path

            def ydl_build(schema: Any) -> Callable[[int], str]:
                def run(i: int) -> str:
                    version = f"v{next(counter)}"
                    ref = ydl.cache_dataset(
                        frame, "bench", version, storage, schema=schema, progress=False
                    )
                    assert len(ref) == args.rows, (len(ref), args.rows)
                    return os.path.join(tmp, "store", "bench", version)

                return run

            def floor(i: int) -> None:
                counted = frame.mapInArrow(count_rows, "rows long").collect()
                assert sum(r.rows for r in counted) == args.rows

            counter = iter(range(10**6))
            fixed = ydl.Schema(
                [
                    ydl.Field("id", np.int64),
                    ydl.Field("x", np.float32, (64,)),
                    ydl.Field("label", np.int32),
                    ydl.Field("name", str),
                ]
            )
            methods: dict[str, Callable[[int], str | None]] = {
                "parquet": parquet,
                "ydl": ydl_build(None),
                "ydl_fixed": ydl_build(fixed),
            }
            if not args.no_floor:
                methods["floor"] = floor
            for i in range(args.repeats):
                for name, method in methods.items():
                    seconds, path = timed(functools.partial(method, i))
                    times.setdefault(name, []).append(seconds)
                    if path is not None:
                        written[name] = folder_bytes(path)
                        if name.startswith("ydl"):
                            storage.delete("bench", os.path.basename(path))
                        else:
                            shutil.rmtree(path)
        load_after_ours = os.getloadavg()
        petastorm = run_petastorm(args, tmp)
        if "times" in petastorm:
            times["petastorm"] = petastorm["times"]
            written["petastorm"] = petastorm["written_bytes"]

        labels = {
            "parquet": "Spark `df.write.parquet` (snappy; the baseline)",
            "ydl": "`ydl.cache_dataset(df, ...)`: x as Spark gives it, a variable-length array",
            "ydl_fixed": "`ydl.cache_dataset(df, ..., schema=...)` with x as float32[64]",
            "floor": "`df.mapInArrow(count rows).collect()` (floor: rows to Python via Arrow)",
            "petastorm": "Petastorm 0.13.1 `make_spark_converter(df)` (uncompressed Parquet)",
        }
        base = min(times["parquet"])
        print(
            f"\n{args.rows:,} rows ({megabytes:.0f} MB of values) in {args.partitions} cached "
            f"partitions, Spark {pyspark.__version__} local[2], {os.cpu_count()} CPUs, "
            f"best of {args.repeats}\n"
        )
        print("| build | seconds | records/s | data MB/s | written MB | vs Spark parquet write |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, label in labels.items():
            if name not in times:
                if name == "petastorm":
                    reason = petastorm.get("skipped", "?")
                    print(f"| {label} | not measured: {reason} | | | | |")
                continue
            best = min(times[name])
            out = f"{written[name] / 1e6:,.0f}" if name in written else "-"
            print(
                f"| {label} | {best:.2f} | {args.rows / best:,.0f} | {megabytes / best:,.0f} "
                f"| {out} | {base / best:.2f}x |"
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "machine": info,
                        "args": vars(args),
                        "data_megabytes": megabytes,
                        "times": times,
                        "written_bytes": written,
                        "petastorm": petastorm,
                        "load_average_after_spark_rows": load_after_ours,
                        "load_average_at_end": os.getloadavg(),
                    },
                    f,
                    indent=1,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
