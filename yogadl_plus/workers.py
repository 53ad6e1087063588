"""Work done ahead of the caller in threads or processes, handed back in submission order.

The order of results never depends on the number of workers or on timing: units are submitted
in order and their results are taken from the front of a bounded queue. At most ``prefetch``
units are in flight, so memory stays bounded however fast the workers are.
"""

from __future__ import annotations

import atexit
import collections
import multiprocessing
import signal
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from yogadl_plus.errors import YogaError

__all__ = ["WORKER_TYPES", "OrderedPool", "WorkerDied"]

WORKER_TYPES = ("thread", "process")
_LIVE_POOLS: weakref.WeakSet[OrderedPool] = weakref.WeakSet()


class WorkerDied(YogaError):
    """A worker process ended without finishing its work (killed, or out of memory)."""


# The one task a process worker runs; set once per worker process by _init_process.
_process_task: Callable[[Any], Any] | None = None


def _init_process(task: Callable[[Any], Any]) -> None:
    global _process_task
    _process_task = task
    # Ctrl-C is the caller's to handle: it stops the iteration and shuts the pool down. A
    # worker dying of it instead would break the pool under the caller's feet.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_in_process(unit: Any) -> Any:
    assert _process_task is not None
    return _process_task(unit)


class OrderedPool:
    """Runs ``task(unit)`` for a stream of units on ``num_workers`` threads or processes."""

    def __init__(
        self,
        task: Callable[[Any], Any],
        num_workers: int,
        worker_type: str = "thread",
        prefetch: int | None = None,
        start_method: str | None = None,
    ) -> None:
        if worker_type not in WORKER_TYPES:
            raise ValueError(f"worker_type must be one of {WORKER_TYPES}, got {worker_type!r}")
        self.task = task
        self.num_workers = num_workers
        self.worker_type = worker_type
        self.prefetch = prefetch if prefetch is not None else 2 * num_workers
        if start_method is None:
            start_method = "fork" if sys.platform.startswith("linux") else "spawn"
        self.start_method = start_method
        self._executor: Executor | None = None
        _LIVE_POOLS.add(self)

    def _start(self) -> Executor:
        if self._executor is None:
            if self.worker_type == "thread":
                self._executor = ThreadPoolExecutor(self.num_workers, "yogadl_plus-worker")
            else:
                self._executor = ProcessPoolExecutor(
                    self.num_workers,
                    mp_context=multiprocessing.get_context(self.start_method),
                    initializer=_init_process,
                    initargs=(self.task,),
                )
        return self._executor

    def _submit(self, unit: Any) -> Future[Any]:
        executor = self._start()
        if self.worker_type == "thread":
            return executor.submit(self.task, unit)
        return executor.submit(_run_in_process, unit)

    def map(self, units: Iterable[Any]) -> Iterator[Any]:
        """Results of ``task`` over ``units``, in order; stops cleanly when dropped early."""
        pending: collections.deque[Future[Any]] = collections.deque()
        units = iter(units)
        try:
            for unit in units:
                pending.append(self._submit(unit))
                if len(pending) >= max(1, self.prefetch):
                    yield self._result(pending.popleft())
            while pending:
                yield self._result(pending.popleft())
        finally:
            for future in pending:
                future.cancel()

    def _result(self, future: Future[Any]) -> Any:
        try:
            return future.result()
        except BrokenProcessPool as exc:
            # Start afresh next time; say now what happened and how to go on.
            self.close()
            raise WorkerDied(
                "a worker process died mid-epoch (killed, or out of memory?): the items handed "
                "out so far are intact; resume from stream.offset, with fewer workers or a "
                "smaller prefetch if memory ran out"
            ) from exc

    def close(self) -> None:
        """Stop the workers; a later map() starts new ones."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def __del__(self) -> None:
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


@atexit.register
def _close_pools_at_exit() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()
