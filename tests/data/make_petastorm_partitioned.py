"""Makes tests/data/petastorm_partitioned: a small Petastorm dataset written by Petastorm 0.13.1
with Spark's ``partitionBy("station", "day")`` (folders ``station=north/day=2/``, and
``day=__HIVE_DEFAULT_PARTITION__`` for a null day; the Parquet files hold neither column), and
the rows it wrote (petastorm_partitioned_expected.npz, -1 for a null day), checked against what
Petastorm's own make_reader decodes.

Run it with the side venv's Python (it needs petastorm and pyspark, which yogadl_plus does not):

    bash bench/baselines/venvs.sh .baselines
    .baselines/petastorm/bin/python tests/data/make_petastorm_partitioned.py
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
from petastorm import make_reader
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import materialize_dataset
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from _spark_local import local_spark  # noqa: E402  (loopback-only, quiet local[2] Spark)

OUT = os.path.join(HERE, "petastorm_partitioned")
ROWS = 24

Readings = Unischema(
    "Readings",
    [
        UnischemaField("id", np.int64, (), ScalarCodec(LongType()), False),
        UnischemaField("station", np.str_, (), ScalarCodec(StringType()), False),
        UnischemaField("day", np.int32, (), ScalarCodec(IntegerType()), True),
        UnischemaField("reading", np.float64, (), ScalarCodec(DoubleType()), False),
        UnischemaField("matrix", np.float32, (2, 3), NdarrayCodec(), False),
    ],
)


def row(i: int) -> dict:
    return {
        "id": np.int64(i),
        "station": ["north", "south"][i % 2],
        "day": None if i % 7 == 6 else np.int32(i % 3 + 1),
        "reading": float(i) / 4,
        "matrix": np.arange(6, dtype=np.float32).reshape(2, 3) * i,
    }


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    url = "file://" + OUT
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's workers: this venv's pyarrow
    with (
        tempfile.TemporaryDirectory() as workdir,
        local_spark("petastorm-partitioned", workdir) as spark,
        materialize_dataset(spark, url, Readings, row_group_size_mb=1),
    ):
        rows = [dict_to_spark_row(Readings, row(i)) for i in range(ROWS)]
        frame = spark.createDataFrame(rows, Readings.as_spark_schema())
        frame.coalesce(1).write.mode("overwrite").partitionBy("station", "day").parquet(url)
    for folder, _, names in os.walk(OUT):  # Spark's checksums: not data (_SUCCESS is kept)
        for name in names:
            if name.startswith("."):
                os.remove(os.path.join(folder, name))
    # What we wrote, checked against what Petastorm's own make_reader decodes. Its reader
    # cannot decode the null partition itself (np.int32(None) fails), so "day" is checked
    # where it is not null.
    written = [row(i) for i in range(ROWS)]
    fields = [name for name in Readings.fields if name != "day"]
    with make_reader(url, schema_fields=fields, shuffle_row_groups=False, workers_count=1,
                     num_epochs=1) as reader:  # fmt: skip
        decoded = sorted((r._asdict() for r in reader), key=lambda r: r["id"])
    assert len(decoded) == ROWS
    for got, want in zip(decoded, written):
        for name in fields:
            assert np.array_equal(got[name], want[name]), (name, got[name], want[name])
    with make_reader(url, schema_fields=["id", "day"], workers_count=1, num_epochs=1) as reader:
        try:
            days = {r.id: r.day for r in reader}
        except Exception as exc:  # the null partition
            print(f"Petastorm's reader fails on day=__HIVE_DEFAULT_PARTITION__: {exc!r}")
        else:
            assert days == {i: r["day"] for i, r in enumerate(written)}, days
    arrays = {
        "id": np.array([r["id"] for r in written]),
        "station": np.array([r["station"] for r in written]),
        "day": np.array([-1 if r["day"] is None else r["day"] for r in written], np.int32),
        "reading": np.array([r["reading"] for r in written]),
        "matrix": np.stack([r["matrix"] for r in written]),
    }
    np.savez(os.path.join(HERE, "petastorm_partitioned_expected.npz"), **arrays)  # no pickles
    print(f"wrote {OUT} and petastorm_partitioned_expected.npz ({ROWS} rows)")


if __name__ == "__main__":
    main()
