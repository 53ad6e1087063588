"""Building a Spark DataFrame: one Spark task per partition writes the partition's chunks into
the storage itself (a folder every executor sees, or the build's folder in a bucket) and
returns their description; the driver checks one result per partition and publishes.

Spark runs a failed task again (``spark.task.maxFailures``): every attempt writes files of its
own (see storage/sink.py), and only the chunks of the attempt whose result Spark returned are
published. A record that does not fit fails the build without retries, as raised in its task.
When the build fails, its Spark job is cancelled and its tasks stopped before what they wrote
is removed, so no task uploads a chunk after the clean-up.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import shutil
import sys
import time
import traceback
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

from yogadl_plus.building.parts import RETRIED, PartResult, PartTask, build_parts, write_part
from yogadl_plus.building.plan import BuildPlan
from yogadl_plus.cache.manifest import Manifest
from yogadl_plus.errors import CacheCorrupted, SchemaError, WorkerDied, YogaError
from yogadl_plus.schema import Schema
from yogadl_plus.sources.spark import SparkDataFrameSource, SparkPartition
from yogadl_plus.storage.sink import ChunkSink

__all__ = ["build_on_spark"]

log = logging.getLogger(__name__)

_RESULT = "part int, result binary"
_STOP_WAIT = 60.0  # seconds to wait for cancelled tasks to stop before cleaning up anyway


def build_on_spark(folder: str, plan: BuildPlan) -> Manifest:
    """Build ``plan`` (a Spark DataFrame's) into staging ``folder`` with one Spark task per
    partition."""
    src = plan.src
    if not isinstance(src, SparkDataFrameSource):
        raise TypeError(f"build_on_spark builds Spark DataFrames, got {src!r}")
    frame = src.dataframe
    schema = plan.schema if plan.schema is not None else src.schema
    missing = [name for name in schema.names if name not in frame.columns]
    if missing:
        raise SchemaError(
            f"fields {missing} of schema= are not columns of the DataFrame: {frame.columns}"
        )
    _check_local_python(frame.sparkSession.sparkContext)
    # Columns travel by position: names with dots, or differing only in case, stay as they are.
    positional = frame.toDF(*(f"_{i}" for i in range(len(frame.columns))))
    task = functools.partial(_write_partition, schema, list(frame.columns), plan.chunk_bytes)

    def run(sink: ChunkSink) -> list[PartResult]:
        with warnings.catch_warnings():  # pyspark's own, on newer pandas than it has tried
            warnings.filterwarnings("ignore", "PySpark does not yet fully support", FutureWarning)
            written = positional.mapInArrow(functools.partial(task, sink), _RESULT)
        with _stopped_on_failure(frame.sparkSession.sparkContext):
            rows = written.collect()
        outcomes = sorted((row.part, _unpickled(row.result, row.part)) for row in rows)
        for _, outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        if [part for part, _ in outcomes] != list(range(len(outcomes))):
            raise CacheCorrupted(f"Spark returned partitions {[p for p, _ in outcomes]}")
        return [result for _, result in outcomes]

    return build_parts(folder, plan, schema, True, run)


@contextlib.contextmanager
def _stopped_on_failure(context: Any) -> Iterator[None]:
    """Run the block's Spark jobs in a job group of their own. If the block fails (a task's
    error, Ctrl-C), cancel them and wait until their tasks have stopped; a job that failed
    because its tasks died says so with WorkerDied."""
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    saved = {key: context.getLocalProperty(key) for key in keys}
    group = f"yogadl_plus-{uuid.uuid4().hex[:12]}"
    context.setJobGroup(group, "yogadl_plus: writing a cache", interruptOnCancel=True)
    try:
        yield
    except BaseException as exc:
        _cancel(context, group)
        if isinstance(exc, Exception) and "Python worker exited unexpectedly" in str(exc):
            raise WorkerDied(
                "a Spark task writing the cache failed as often as Spark retries one "
                "(spark.task.maxFailures): its Python worker died (killed, or out of memory?)"
            ) from exc
        raise
    finally:
        with contextlib.suppress(Exception):
            for key, value in saved.items():
                context.setLocalProperty(key, value)


def _cancel(context: Any, group: str) -> None:
    """Cancel the jobs of ``group`` and wait (a while) until none of their tasks runs."""
    with contextlib.suppress(Exception):  # best effort: the clean-up comes next either way
        context.cancelJobGroup(group)
        tracker = context.statusTracker()
        deadline = time.monotonic() + _STOP_WAIT
        while time.monotonic() < deadline:
            stages = [
                tracker.getStageInfo(stage)
                for job in tracker.getJobIdsForGroup(group)
                for stage in getattr(tracker.getJobInfo(job), "stageIds", [])
            ]
            if not any(info is not None and info.numActiveTasks for info in stages):
                break
            time.sleep(0.1)
        # A killed task's Python worker is stopped up to spark.python.task.killTimeout later.
        kill_timeout = context.getConf().get("spark.python.task.killTimeout", "2s")
        time.sleep(_seconds(kill_timeout) + 1.0)


def _seconds(duration: str) -> float:
    """A Spark duration ("2s", "500ms", "1min", "3") in seconds."""
    units = {"ms": 0.001, "s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
    for unit in sorted(units, key=len, reverse=True):
        if duration.endswith(unit) and duration[: -len(unit)].strip().isdigit():
            return int(duration[: -len(unit)]) * units[unit]
    return float(duration) if duration.replace(".", "", 1).isdigit() else 2.0


def _check_local_python(context: Any) -> None:
    """A local Spark runs its Python workers with ``$PYSPARK_PYTHON`` or the ``python3`` on
    the PATH, not with this interpreter: from a virtual environment that is not activated (as
    Slurm and cron run it), the workers miss yogadl_plus's dependencies and every task fails
    after a minute or more. Said (a WARNING) before any task starts, with the fix."""
    if not str(context.master).startswith("local"):
        return  # (a cluster's executors have their own Python)
    found = shutil.which(context.pythonExec)
    if found is None or os.path.dirname(found) != os.path.dirname(sys.executable):
        log.warning(
            "Spark's Python workers run %r (%s), not this Python (%s): if its packages are "
            "not theirs, the tasks fail with ModuleNotFoundError. Set "
            "os.environ['PYSPARK_PYTHON'] = sys.executable before creating the SparkSession, "
            "or activate the virtual environment",
            context.pythonExec,
            found or "not found",
            sys.executable,
        )


def _write_partition(
    schema: Schema, names: list[str], chunk_bytes: int, sink: ChunkSink, batches: Iterator[Any]
) -> Iterator[Any]:
    """In a Spark task: write this partition's records (columns named ``names`` by position);
    yield one row for the driver, the PartResult or the error that fails the build (pickled)."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None, "called outside a Spark task"
    number = context.partitionId()
    named = (pa.RecordBatch.from_arrays(batch.columns, names=names) for batch in batches)
    task = PartTask(number, SparkPartition(schema, named), schema, chunk_bytes, sink)
    try:
        outcome: PartResult | BaseException = write_part(task)
    except RETRIED:
        raise  # Spark runs the task again
    except Exception as exc:
        outcome = _in_partition(exc, number)
    yield pa.RecordBatch.from_arrays(
        [pa.array([number], pa.int32()), pa.array([pickle.dumps(outcome)], pa.binary())],
        names=["part", "result"],
    )


def _in_partition(error: Exception, number: int) -> BaseException:
    """``error``, of the same type where it can be, saying which partition raised it; its
    traceback in the executor goes with it as a note."""
    message = f"Spark partition {number} (records counted from its first): {error}"
    try:
        named = type(error)(message)
        pickle.loads(pickle.dumps(named))
    except Exception:
        named = YogaError(f"{message} ({type(error).__name__})")
    if not isinstance(error, YogaError):
        named.__notes__ = [traceback.format_exc()]
    return named


def _unpickled(data: bytes, part: int) -> Any:
    """A task's result, as _write_partition pickled it. It comes from this build's own tasks,
    through the channel Spark itself pickles everything over; nothing read from a cache or a
    bucket is ever unpickled."""
    try:
        return pickle.loads(data)
    except Exception as exc:  # an error type the driver cannot import
        return YogaError(
            f"Spark partition {part} failed with an error this process cannot read back ({exc})"
        )
