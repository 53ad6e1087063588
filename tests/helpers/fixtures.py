"""Pytest plugin: the fixtures every test module may use (registered from ``tests/conftest.py``).

``_isolated_yogadl_home`` (autouse) keeps every test off ``~/.cache/yogadl_plus``;
``local_storage`` is a LocalStorage in the test's temp folder; ``ray_cluster`` is a local Ray
cluster and ``spark`` a local Spark session, each for the session.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import yogadl_plus as ydl
from helpers.marks import require_mark
from helpers.servers import start_local_ray, stop_spark

TESTS = Path(__file__).resolve().parents[1]  # Ray's and Spark's workers import test modules


@pytest.fixture(autouse=True)
def _isolated_yogadl_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test may touch ~/.cache/yogadl_plus: default_storage() points into a temp folder."""
    monkeypatch.setenv("YOGADL_PLUS_HOME", str(tmp_path_factory.mktemp("yogadl_home")))


@pytest.fixture
def local_storage(tmp_path) -> ydl.LocalStorage:
    """A LocalStorage in a fresh temp folder (``<tmp_path>/store``)."""
    return ydl.LocalStorage(tmp_path / "store")


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 2 CPUs on 127.0.0.1 for the session, shut down at its end."""
    ray = pytest.importorskip("ray")
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    ray.shutdown()  # one a documentation snippet started, without this runtime environment
    start_local_ray(ray, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def spark():
    """Spark in local mode on 127.0.0.1: 2 task threads, a failed task tried up to 3 times
    (local[2, 3]); stopped, its JVM included, at the end of the session."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    require_mark("spark", "a local Spark session")
    stop_spark()  # one a documentation snippet left, with another configuration
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # what the JVM binds, whatever the hostname
    session = (
        SparkSession.builder.master("local[2, 3]")
        .appName("yogadl_plus tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", str(TESTS))
        .config("spark.sql.shuffle.partitions", "3")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("FATAL")
    yield session
    stop_spark()
