"""Makes tests/data/petastorm_sensors: a small Petastorm dataset written by Petastorm 0.13.1 with
Spark in local mode, and what Petastorm's own make_reader decodes from it (expected.npz).

Run it with the side venv's Python (it needs petastorm and pyspark, which yogadl_plus does not):

    bash bench/baselines/venvs.sh .baselines
    .baselines/petastorm/bin/python tests/data/make_petastorm_dataset.py
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
from petastorm import make_reader
from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import materialize_dataset
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from _spark_local import local_spark  # noqa: E402  (loopback-only, quiet local[2] Spark)

OUT = os.path.join(HERE, "petastorm_sensors")
ROWS = 40

Sensors = Unischema(
    "Sensors",
    [
        UnischemaField("id", np.int64, (), ScalarCodec(LongType()), False),
        UnischemaField("station", np.str_, (), ScalarCodec(StringType()), False),
        UnischemaField("level", np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField("reading", np.float64, (), ScalarCodec(DoubleType()), True),
        UnischemaField("matrix", np.float32, (4, 5), NdarrayCodec(), False),
        UnischemaField("trace", np.int16, (None,), CompressedNdarrayCodec(), False),
        UnischemaField("image_png", np.uint8, (12, 10, 3), CompressedImageCodec("png"), False),
        UnischemaField("mask_png", np.uint8, (8, 8), CompressedImageCodec("png"), False),
        UnischemaField("photo", np.uint8, (16, 16, 3), CompressedImageCodec("jpeg", 90), False),
    ],
)


def row(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {
        "id": np.int64(i),
        "station": ["north", "south", "east"][i % 3],
        "level": np.int32(i * 7 % 11),
        "reading": None if i % 5 == 4 else float(i) / 3,
        "matrix": rng.standard_normal((4, 5)).astype(np.float32),
        "trace": np.arange(i % 6, dtype=np.int16) * 3,
        "image_png": rng.integers(0, 255, (12, 10, 3), dtype=np.uint8),
        "mask_png": (rng.random((8, 8)) > 0.5).astype(np.uint8) * 255,
        "photo": np.full((16, 16, 3), i * 5, dtype=np.uint8),
    }


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    url = "file://" + OUT
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's workers: this venv's pyarrow
    with (
        tempfile.TemporaryDirectory() as workdir,
        local_spark("petastorm-data", workdir) as spark,
        materialize_dataset(spark, url, Sensors, row_group_size_mb=1),
    ):
        rows = [dict_to_spark_row(Sensors, row(i)) for i in range(ROWS)]
        frame = spark.createDataFrame(rows, Sensors.as_spark_schema())
        frame.coalesce(2).write.mode("overwrite").parquet(url)
    for name in os.listdir(OUT):  # Spark's checksums and success marker: not data
        if name.startswith(".") or name == "_SUCCESS":
            os.remove(os.path.join(OUT, name))
    expected: dict[str, list] = {}
    with make_reader(url, shuffle_row_groups=False, workers_count=1, num_epochs=1) as reader:
        for decoded in reader:
            for name, value in decoded._asdict().items():
                expected.setdefault(name, []).append(value)
    order = np.argsort(expected["id"])
    arrays = {}
    for name, values in expected.items():
        values = [values[j] for j in order]
        if name == "trace":  # variable length: flat values and each row's length
            arrays["trace_values"] = np.concatenate(values)
            arrays["trace_lengths"] = np.array([len(v) for v in values])
        elif name == "reading":  # nullable: NaN for None
            arrays[name] = np.array([np.nan if v is None else v for v in values])
        else:
            arrays[name] = np.stack([np.asarray(v) for v in values])
    np.savez(os.path.join(HERE, "petastorm_sensors_expected.npz"), **arrays)  # no pickles
    print(f"wrote {OUT} and petastorm_sensors_expected.npz ({len(order)} rows)")


if __name__ == "__main__":
    main()
