"""Work done ahead of the caller in threads, processes or Ray actors, handed back in submission
order.

The order of results never depends on the number of workers or on timing: units are submitted
in order and their results are taken in that order (process workers get units in turn, and
each hands its results back in the order it got its units). At most ``prefetch`` units are in
flight, so memory stays bounded however fast the workers are.

Workers always stop. Asked to (``close()``, a dropped stream, the end of the program after the
loop ended or Ctrl-C), they leave between units; a process worker still busy after
``GRACE_SECONDS`` (a transform that never returns) ends itself, and is terminated by the
caller if even that fails. Threads cannot be stopped in Python: thread workers are daemon
threads, waited for ``GRACE_SECONDS``; one stuck in a transform runs on until the process exits,
which does not wait for it.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from yogadl_plus import lifecycle
from yogadl_plus.errors import WorkerDied
from yogadl_plus.stream.workers import processes
from yogadl_plus.stream.workers.base import GRACE_SECONDS, Task, Workers
from yogadl_plus.stream.workers.rayactors import RayWorkers
from yogadl_plus.stream.workers.threads import ThreadWorkers

__all__ = ["KINDS", "OrderedPool"]

#: The kinds of workers, by ``worker_type``: a new kind is a ``Workers`` subclass in a module of
#: its own (base.py says what it provides), named here.
KINDS: dict[str, type[Workers]] = {
    "thread": ThreadWorkers,
    "process": processes.ProcessWorkers,
    "ray": RayWorkers,
}


class OrderedPool:
    """Runs ``task(unit)`` for a stream of units on ``num_workers`` threads, processes or Ray
    actors."""

    def __init__(
        self,
        task: Task,
        num_workers: int,
        worker_type: str = "thread",
        prefetch: int | None = None,
        start_method: str | None = None,
    ) -> None:
        if worker_type not in KINDS:
            raise ValueError(f"worker_type must be one of {tuple(KINDS)}, got {worker_type!r}")
        self.task = task
        self.num_workers = num_workers
        self.worker_type = worker_type
        self.prefetch = max(1, prefetch if prefetch is not None else 2 * num_workers)
        if start_method is None:
            start_method = "fork" if sys.platform.startswith("linux") else "spawn"
        self.start_method = start_method
        self._workers: Workers | None = None
        _POOLS.add(self)

    def _started(self) -> Workers:
        workers = self._workers
        if workers is None or workers.closed or workers.owner != os.getpid():
            kind = KINDS[self.worker_type]
            workers = self._workers = kind(self.task, self.num_workers, self.start_method)
        return workers

    def map(self, units: Iterable[Any]) -> Iterator[Any]:
        """Results of ``task`` over ``units``, in order; stops cleanly when dropped early."""
        pending: collections.deque[tuple[Any, Workers, Any]] = collections.deque()
        try:
            for unit in units:
                workers = self._started()
                pending.append((unit, workers, workers.submit(unit)))
                if len(pending) >= self.prefetch:
                    yield self._next(pending)
            while pending:
                yield self._next(pending)
        finally:
            for workers in {id(w): w for _, w, _ in pending}.values():
                workers.cancel([ticket for _, w, ticket in pending if w is workers])

    def _next(self, pending: collections.deque[tuple[Any, Workers, Any]]) -> Any:
        if pending[0][1].closed:
            # close() ran while this map was going on: its units in flight go to new workers.
            units = [unit for unit, _, _ in pending]
            pending.clear()
            workers = self._started()
            pending.extend((unit, workers, workers.submit(unit)) for unit in units)
        unit, workers, ticket = pending.popleft()
        try:
            return workers.result(ticket, unit)
        except BaseException as exc:
            # After a death (the others may hold the lost unit's successors) or an interrupted
            # read, these workers are done with: the next map() starts afresh.
            if workers.closed or isinstance(exc, WorkerDied):
                self._close(workers)
            raise

    def close(self) -> None:
        """Stop the workers, ending within about GRACE_SECONDS those stuck in a unit; a later
        map() starts new ones."""
        if self._workers is not None:
            self._close(self._workers)

    def _close(self, workers: Workers) -> None:
        if workers is self._workers:
            self._workers = None
        workers.stop()
        workers.finish(time.monotonic() + GRACE_SECONDS)

    def detach(self) -> Workers | None:
        """The running workers, which this pool lets go of (the exit handler stops them)."""
        workers, self._workers = self._workers, None
        return workers

    def __del__(self) -> None:
        # No waiting here: the workers leave by themselves (see _receive_units).
        workers = getattr(self, "_workers", None)
        if workers is not None:
            workers.stop()


def _stop_workers_at_exit() -> None:
    # Before multiprocessing's own exit handler (see lifecycle): that one would wait for our
    # worker processes forever if one were stuck.
    running = []
    for pool in _POOLS:
        workers = pool.detach()
        if workers is not None:
            workers.stop()
            running.append(workers)
    deadline = time.monotonic() + GRACE_SECONDS
    for workers in running:
        workers.finish(deadline)
    processes.end_all()


# The pools alive in this process: the exit handler stops their workers.
_POOLS: lifecycle.Registry[OrderedPool] = lifecycle.Registry("worker pools")
lifecycle.at_exit(_stop_workers_at_exit)
