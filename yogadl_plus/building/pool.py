"""Parallel builds: cut a source into parts, write each part's chunks in its own task (a pool of
processes on this machine, or Ray tasks on a cluster), then check them and publish one version.
(Spark DataFrames are built by Spark's own tasks, the same way: see building/spark.py.)

Both runners keep to the part protocol of building/parts.py: a part whose task died, or failed
with an error worth retrying, runs again (up to ``ATTEMPTS`` times), and nothing is published
unless every part is in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from yogadl_plus.building import starts
from yogadl_plus.building.parts import (
    ATTEMPTS,
    RETRIED,
    PartResult,
    PartTask,
    build_parts,
    write_part,
)
from yogadl_plus.building.plan import BuildPlan
from yogadl_plus.cache.layout import RecordLayout
from yogadl_plus.cache.manifest import Manifest
from yogadl_plus.cache.version_writer import INFER_RECORDS, caching_bar
from yogadl_plus.errors import CacheCorrupted, WorkerDied, YogaError, missing_extra
from yogadl_plus.schema import Schema, infer_schema
from yogadl_plus.sources.base import Source

if TYPE_CHECKING:
    from yogadl_plus.storage.sink import ChunkSink

__all__ = ["build_in_parallel"]

log = logging.getLogger(__name__)

_PARTS_PER_SLOT = 4  # more parts than slots: a slow part does not leave the others idle
#: Opens the build's progress bar: its ``advance(records)``.
Bar = Callable[[], contextlib.AbstractContextManager[Callable[[int], object]]]


def build_in_parallel(folder: str, plan: BuildPlan) -> Manifest:
    """Build ``plan`` into staging ``folder`` with ``plan.workers`` parallel tasks on
    ``plan.engine``."""
    src = plan.src
    if plan.engine == "local" and src.kind == "ray":
        raise ValueError("a ray.data.Dataset is built in parallel by Ray: pass engine='ray'")
    runner: _PoolRunner | _RayRunner = (
        _RayRunner(plan.workers) if plan.engine == "ray" else _PoolRunner(plan)
    )
    parts = src.split(_PARTS_PER_SLOT * runner.slots)
    if parts is None:
        raise ValueError(
            f"a {type(src).__name__} is read once, in order, so it cannot be built by parallel "
            "tasks: parallel builds take Parquet data, a map-style (indexable) dataset, a list "
            "of records or a ray.data.Dataset; build it without workers= / engine="
        )
    schema = plan.schema if plan.schema is not None else src.schema
    if schema is None:
        schema, serial = _inferred(parts, src.length)
        if plan.engine == "local" and serial is not None and serial < starts.SERIAL_UNDER_SECONDS:
            log.info(
                "%s:%s is built serially, not by %d workers: its %s records take about %.2f s "
                "to read and encode here (as its first ones tell), under the %.1f s below "
                "which worker processes do not pay off",
                plan.dataset_id,
                plan.version,
                runner.slots,
                src.length,
                serial,
                starts.SERIAL_UNDER_SECONDS,
            )
            return plan.write_serially(folder)
    bar = functools.partial(caching_bar, plan.progress, src.length, plan.dataset_id, plan.version)

    def run(sink: ChunkSink) -> list[PartResult]:
        tasks = [PartTask(i, part, schema, plan.chunk_bytes, sink) for i, part in enumerate(parts)]
        results = runner.run(tasks, bar)
        for task in tasks:
            expected, wrote = task.source.length, results[task.number].records
            if expected is not None and wrote != expected:
                raise CacheCorrupted(
                    f"part {task.number} ({task.source!r}) wrote {wrote} records, expected "
                    f"{expected}"
                )
        return [results[t.number] for t in tasks]

    return build_parts(folder, plan, schema, plan.engine == "ray", run)


def _inferred(parts: list[Source], length: int | None) -> tuple[Schema, float | None]:
    """The schema of the first records, across parts (as a serial build infers it), and about
    how long a serial build of the whole source takes here, from how long reading and encoding
    them took (a record encodes to as many bytes as a worker would write and hash)."""
    began = time.perf_counter()
    records = itertools.chain.from_iterable(p.records() for p in parts)
    head = list(itertools.islice(records, INFER_RECORDS))
    schema = infer_schema(head)
    layout = RecordLayout(schema)
    for index, record in enumerate(head):
        layout.encode(record, index)
    took = time.perf_counter() - began
    return schema, starts.serial_time(took, len(head), length)


class _PoolRunner:
    """Parts on a pool of ``plan.workers`` processes: forked from this process where that is
    safe, else from a forkserver that imports the build code and the source's framework once,
    or spawned (see building/starts.py); how is logged, once.

    When a worker dies, every part in the pool fails with it; only the parts that had started
    (each marks its start in a folder) are charged an attempt, the others simply run again.
    """

    def __init__(self, plan: BuildPlan) -> None:
        self.plan = plan
        self.slots = plan.workers or os.cpu_count() or 1
        self.said: str | None = None  # how the last pool's workers started, as logged

    def run(self, tasks: list[PartTask], bar: Bar) -> dict[int, PartResult]:
        _check_picklable(tasks)
        results: dict[int, PartResult] = {}
        failures: dict[int, list[BaseException]] = {t.number: [] for t in tasks}
        barren_pools = 0  # pools that broke before any part started: workers cannot start
        with contextlib.ExitStack() as stack:
            started = stack.enter_context(tempfile.TemporaryDirectory(prefix="yogadl-plus-parts-"))
            done: Callable[[int], Any] | None = None
            while len(results) < len(tasks):
                pending = [t for t in tasks if t.number not in results]
                charged = sum(map(len, failures.values()))
                pool = self._pool(min(self.slots, len(pending)))
                broken_with: int | None = None  # parts started when this pool broke
                try:
                    running = {pool.submit(_pool_part, t, started): t for t in pending}
                    if done is None:  # (the bar may start a thread: after the workers fork)
                        done = stack.enter_context(bar())
                    while running:
                        finished, _ = wait(running, return_when=FIRST_COMPLETED)
                        for future in finished:
                            task = running.pop(future)
                            error = future.exception()
                            if error is None:
                                results[task.number] = future.result()
                                done(results[task.number].records)
                                continue
                            if isinstance(error, BrokenProcessPool) and broken_with is None:
                                broken_with = sum(
                                    int(n) not in results for n in os.listdir(started)
                                )
                            alone = broken_with is None or broken_with <= 1
                            if _charge(started, task, error, failures[task.number], alone):
                                running[pool.submit(_pool_part, task, started)] = task
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
                if len(results) < len(tasks) and sum(map(len, failures.values())) == charged:
                    barren_pools += 1
                    if barren_pools >= ATTEMPTS:
                        raise WorkerDied(
                            f"the build's worker processes died {ATTEMPTS} times before any "
                            "part started: could they not start? (see the messages above; a "
                            "script that builds at its top level needs "
                            '`if __name__ == "__main__":`)'
                        )
        return results

    def _pool(self, workers: int) -> ProcessPoolExecutor:
        """A pool of ``workers`` processes, started as is safe now; how is logged the first
        time (INFO), and again when a later pool of the build starts otherwise (DEBUG)."""
        start = starts.worker_start(self.plan.src)
        if start.how != self.said:
            log.log(
                logging.INFO if self.said is None else logging.DEBUG,
                "%s:%s is built by %d worker processes %s",
                self.plan.dataset_id,
                self.plan.version,
                workers,
                start.how,
            )
            self.said = start.how
        return ProcessPoolExecutor(workers, mp_context=start.context)


def _pool_part(task: PartTask, started: str) -> PartResult:
    """In a pool worker: mark the part as started (for the driver, should this process die),
    then write it."""
    with open(os.path.join(started, str(task.number)), "w"):
        pass
    return write_part(task)


def _charge(
    started: str,
    task: PartTask,
    error: BaseException,
    failures: list[BaseException],
    alone: bool = True,
) -> bool:
    """Count a failed attempt against its part; raise when the build must end. True: submit
    the part again to this pool (False: the pool broke, the next pool runs it).

    A broken pool ends every part running in it, and which one's worker died cannot be told
    when several were (``alone`` False): each such part is charged, but a part ends the build
    only after ATTEMPTS breaks it alone ran into, or ATTEMPTS times as many shared ones (it
    would have died in every one of them)."""
    marker = os.path.join(started, str(task.number))
    had_started = os.path.exists(marker)
    if had_started:
        os.remove(marker)  # its next attempt marks it again
    if isinstance(error, BrokenProcessPool):
        if not had_started:
            return False  # queued when another part's worker died: not its fault
    elif not isinstance(error, RETRIED):
        raise error
    failures.append(error if alone else _Shared(error))
    alone_ones = sum(not isinstance(f, _Shared) for f in failures)
    if alone_ones >= ATTEMPTS or len(failures) >= ATTEMPTS * ATTEMPTS:
        if not isinstance(error, BrokenProcessPool):
            raise error
        raise WorkerDied(
            f"part {task.number} ({task.source!r}): its worker process died {ATTEMPTS} "
            "times (killed, or out of memory? try fewer workers=)"
        ) from error
    return not isinstance(error, BrokenProcessPool)


class _Shared(Exception):
    """A break of the pool that several started parts were in: any of them may have died."""


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
        except ModuleNotFoundError as exc:
            raise missing_extra(exc, "engine='ray'") from None
        if not ray.is_initialized():
            ray.init()
        self.slots = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))

    def run(self, tasks: list[PartTask], bar: Bar) -> dict[int, PartResult]:
        import ray

        # Ray re-runs a task whose worker died, and one that raised a retried error.
        remote = ray.remote(_ray_part).options(
            num_cpus=1, max_retries=ATTEMPTS - 1, retry_exceptions=list(RETRIED)
        )
        waiting = list(tasks)
        running: dict[Any, PartTask] = {}
        results: dict[int, PartResult] = {}
        try:
            with bar() as done:
                while waiting or running:
                    while waiting and len(running) < self.slots:
                        task = waiting.pop(0)
                        block = getattr(task.source, "ray_object", None)
                        running[remote.remote(task, block)] = task
                    finished, _ = ray.wait(list(running), num_returns=1)
                    task = running.pop(finished[0])
                    results[task.number] = _ray_result(ray, finished[0], task)
                    done(results[task.number].records)
        finally:
            for ref in running:
                ray.cancel(ref, force=True)
        return results


def _ray_part(task: PartTask, block: Any = None) -> PartResult:
    """In a Ray task. ``block``: the part's own Ray object (a ray.data block), passed as an
    argument so that Ray schedules the task where it lives and hands it over resolved."""
    if block is not None:
        task = dataclasses.replace(task, source=task.source.with_object(block))  # type: ignore[attr-defined]
    return write_part(task)


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
