"""A quiet, offline, loopback-only local Spark session, for building Petastorm datasets in the
Petastorm side venv (Spark comes with petastorm there)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any

LOG4J2 = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@contextlib.contextmanager
def local_spark(app: str, workdir: str) -> Iterator[Any]:
    """A local[2] SparkSession bound to 127.0.0.1, no UI, errors-only logs, scratch files under
    ``workdir/spark_tmp``; afterwards its JVM is ended and the scratch files removed."""
    from pyspark.sql import SparkSession

    spark_tmp = os.path.join(workdir, "spark_tmp")
    os.makedirs(spark_tmp, exist_ok=True)
    log4j = os.path.join(spark_tmp, "log4j2.properties")
    with open(log4j, "w") as f:  # JVM log: errors only
        f.write(LOG4J2)
    # Spark's Python workers: no FutureWarnings from petastorm's use of old pyarrow APIs.
    os.environ["PYTHONWARNINGS"] = "ignore::FutureWarning,ignore::DeprecationWarning"
    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.driver.memory", "3g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.local.dir", spark_tmp)
        .config("spark.sql.warehouse.dir", os.path.join(spark_tmp, "warehouse"))
        .config(
            "spark.driver.extraJavaOptions",
            f"-Djava.io.tmpdir={spark_tmp} -Dlog4j2.configurationFile=file:{log4j}",
        )
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()
        _end_jvm()
        shutil.rmtree(spark_tmp, ignore_errors=True)


def _end_jvm() -> None:
    """End the JVM the session started (by its PID), so that it does not sit beside the next."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        gateway.proc.kill()
        gateway.proc.wait()
        SparkContext._gateway = SparkContext._jvm = None
