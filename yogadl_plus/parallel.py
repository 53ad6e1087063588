"""Parallel builds: cut a source into parts, write each part's chunks in its own task (a pool of
processes on this machine, or Ray tasks on a cluster), then check them and publish one version.

The driver keeps exactly one result per part, whatever happened to other attempts: a part
whose task died (its process killed) or failed with an ``OSError`` (a dropped connection) runs
again, up to ``ATTEMPTS`` times, and writes files of its own (see storage/sink.py), so no record
is lost or written twice. Other errors (a record that does not fit the schema) fail the build
at once. Nothing is published unless every part is in place.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from yogadl_plus.build import (
    finish_version,
    progress_bar,
    resolve_schema,
    write_records,
)
from yogadl_plus.cache.manifest import ChunkInfo, Manifest
from yogadl_plus.errors import CacheCorrupted, YogaError
from yogadl_plus.schema import Schema
from yogadl_plus.sources.base import Source
from yogadl_plus.storage.sink import ChunkSink, part_prefix
from yogadl_plus.workers import WorkerDied

if TYPE_CHECKING:
    from yogadl_plus.storage.base import Storage

__all__ = ["ATTEMPTS", "PartResult", "PartTask", "build_in_parallel", "write_part"]

ATTEMPTS = 3
_PARTS_PER_SLOT = 4  # more parts than slots: a slow part does not leave the others idle
_RETRIED = (OSError,)


@dataclass(frozen=True)
class PartTask:
    """Everything a task needs to write one part; sent to the worker as it is."""

    number: int
    source: Source
    schema: Schema
    chunk_bytes: int
    sink: ChunkSink


@dataclass(frozen=True)
class PartResult:
    number: int
    chunks: list[ChunkInfo]
    records: int


def write_part(task: PartTask) -> PartResult:
    """In a worker: write one part's records as chunks and hand them to the sink."""
    prefix = part_prefix(task.number, uuid.uuid4().hex[:8])
    with task.sink.folder() as folder:
        chunks = write_records(
            folder,
            task.source.records(),
            task.schema,
            task.chunk_bytes,
            first=task.source.offset or 0,
            prefix=prefix,
        )
        delivered = task.sink.deliver(folder, chunks)
    return PartResult(task.number, delivered, sum(c.records for c in chunks))


def build_in_parallel(
    folder: str,
    src: Source,
    dataset_id: str,
    version: str,
    storage: Storage,
    *,
    schema: Schema | None,
    progress: bool,
    chunk_bytes: int,
    workers: int | None,
    engine: str,
) -> Manifest:
    """Build ``src`` into staging ``folder`` with ``workers`` parallel tasks on ``engine``."""
    if engine == "local" and src.kind == "ray":
        raise ValueError("a ray.data.Dataset is built in parallel by Ray: pass engine='ray'")
    runner: _PoolRunner | _RayRunner = (
        _RayRunner(workers) if engine == "ray" else _PoolRunner(workers)
    )
    parts = src.split(_PARTS_PER_SLOT * runner.slots)
    if parts is None:
        raise ValueError(
            f"a {type(src).__name__} is read once, in order, so it cannot be built by parallel "
            "tasks: parallel builds take Parquet data, a map-style (indexable) dataset, a list "
            "of records or a ray.data.Dataset; build it without workers= / engine="
        )
    if schema is None:
        schema = src.schema
    if schema is None:
        first = next((p for p in parts if p.length != 0), parts[0]) if parts else src
        schema, _ = resolve_schema(first, None)
    sink = storage.chunk_sink(folder, distributed=engine == "ray")
    tasks = [PartTask(i, part, schema, chunk_bytes, sink) for i, part in enumerate(parts)]
    bar = progress_bar(progress, src.length, f"{dataset_id}:{version}")
    try:
        results = runner.run(tasks, bar.update if bar is not None else lambda _: None)
    finally:
        if bar is not None:
            bar.close()
    for task in tasks:
        expected, wrote = task.source.length, results[task.number].records
        if expected is not None and wrote != expected:
            raise CacheCorrupted(
                f"part {task.number} ({task.source!r}) wrote {wrote} records, expected {expected}"
            )
    chunks = list(itertools.chain.from_iterable(results[t.number].chunks for t in tasks))
    sink.settle(chunks)
    return finish_version(folder, src, schema, chunks, dataset_id, version)


class _PoolRunner:
    """Parts on a pool of ``workers`` processes, started from a fresh interpreter (safe
    whatever threads the parent runs): forked from a forkserver that has imported the build
    code once, where there is one (half a second less per pool than spawning), else spawned."""

    def __init__(self, workers: int | None) -> None:
        self.slots = workers or os.cpu_count() or 1

    def run(self, tasks: list[PartTask], done: Callable[[int], Any]) -> dict[int, PartResult]:
        _check_picklable(tasks)
        results: dict[int, PartResult] = {}
        attempts = dict.fromkeys((t.number for t in tasks), 0)
        context = _fresh_processes()
        while len(results) < len(tasks):
            pending = [t for t in tasks if t.number not in results]
            pool = ProcessPoolExecutor(min(self.slots, len(pending)), mp_context=context)
            try:
                running = {pool.submit(write_part, t): t for t in pending}
                for t in pending:
                    attempts[t.number] += 1
                while running:
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        task = running.pop(future)
                        result = _result(future, task, attempts[task.number])
                        if result is not None:
                            results[task.number] = result
                            done(result.records)
                        elif not isinstance(future.exception(), BrokenProcessPool):
                            running[pool.submit(write_part, task)] = task
                            attempts[task.number] += 1
            except BrokenProcessPool:
                pass  # a worker died: start a new pool for the parts not done
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        return results


def _fresh_processes() -> multiprocessing.context.BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["yogadl_plus.parallel", "pyarrow.parquet"])
    return context


def _result(future: Future[PartResult], task: PartTask, attempts: int) -> PartResult | None:
    """The part's result; None to run it again; raises what ends the build."""
    error = future.exception()
    if error is None:
        return future.result()
    if not isinstance(error, (BrokenProcessPool, *_RETRIED)):
        raise error
    if attempts >= ATTEMPTS:
        why = (
            "its worker process died (killed, out of memory, or it could not start: see the "
            "messages above)"
            if isinstance(error, BrokenProcessPool)
            else f"it failed with {error!r}"
        )
        message = f"part {task.number} ({task.source!r}): {why}, {attempts} times"
        raise WorkerDied(message) from error
    return None


def _check_picklable(tasks: list[PartTask]) -> None:
    try:
        pickle.dumps(tasks[0]) if tasks else None
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise YogaError(
            f"the parts of this source cannot be sent to worker processes ({exc}): define the "
            "dataset's class at the top level of an importable module (not inside a function), "
            "and guard the script with `if __name__ == '__main__':`"
        ) from exc


class _RayRunner:
    """Parts as Ray tasks on the cluster ``ray.init()`` joins (or starts, on this machine)."""

    def __init__(self, workers: int | None) -> None:
        try:
            import ray
        except ImportError:
            raise ImportError("engine='ray' needs Ray: pip install 'yogadl_plus[ray]'") from None
        if not ray.is_initialized():
            ray.init()
        self.slots = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))

    def run(self, tasks: list[PartTask], done: Callable[[int], Any]) -> dict[int, PartResult]:
        import ray

        # Ray re-runs a task whose worker died, and one that raised a retried error.
        remote = ray.remote(write_part).options(
            num_cpus=1, max_retries=ATTEMPTS - 1, retry_exceptions=list(_RETRIED)
        )
        waiting = list(tasks)
        running: dict[Any, PartTask] = {}
        results: dict[int, PartResult] = {}
        try:
            while waiting or running:
                while waiting and len(running) < self.slots:
                    task = waiting.pop(0)
                    running[remote.remote(task)] = task
                finished, _ = ray.wait(list(running), num_returns=1)
                task = running.pop(finished[0])
                results[task.number] = _ray_result(ray, finished[0], task)
                done(results[task.number].records)
        finally:
            for ref in running:
                ray.cancel(ref, force=True)
        return results


def _ray_result(ray: Any, ref: Any, task: PartTask) -> PartResult:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            raise cause from None  # the task's own error (a SchemaError, ...), as raised there
        raise
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
        raise WorkerDied(
            f"part {task.number} ({task.source!r}): its Ray task died {ATTEMPTS} times"
        ) from exc
