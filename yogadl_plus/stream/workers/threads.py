"""Worker threads: the task runs in daemon threads of this process (``worker_type="thread"``)."""

from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from concurrent.futures import Future
from typing import Any

from yogadl_plus.stream.workers.base import GRACE_SECONDS, Task, Workers

__all__ = ["ThreadWorkers"]


class ThreadWorkers(Workers):
    """Daemon threads of this process running the task."""

    def __init__(self, task: Task, num_workers: int, start_method: str) -> None:
        self.owner = os.getpid()
        self._jobs: queue.SimpleQueue[tuple[Any, Future[Any]] | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        # Daemon threads: the interpreter's exit does not wait for one stuck in a transform.
        self._threads = [
            threading.Thread(
                target=_thread_main,
                args=(task, self._jobs, self._stopping),
                name=f"yogadl_plus-worker-{k}",
                daemon=True,
            )
            for k in range(num_workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, unit: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((unit, future))
        return future

    def result(self, ticket: Future[Any], unit: Any) -> Any:
        return ticket.result()

    def cancel(self, tickets: list[Future[Any]]) -> None:
        for future in tickets:
            future.cancel()

    def stop(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stopping.set()
        for _ in self._threads:
            self._jobs.put(None)

    def finish(self, deadline: float) -> None:
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        busy = sum(thread.is_alive() for thread in self._threads)
        if busy:
            warnings.warn(
                f"{busy} worker thread(s) still busy {GRACE_SECONDS:g} s after being asked to "
                "stop: each leaves after the unit it is on, but Python cannot stop a thread, so "
                "one stuck in the transform runs until the process exits (use "
                "worker_type='process' for transforms that may hang: those are ended)",
                RuntimeWarning,
                stacklevel=4,
            )


def _thread_main(
    task: Task,
    jobs: queue.SimpleQueue[tuple[Any, Future[Any]] | None],
    stopping: threading.Event,
) -> None:
    while (job := jobs.get()) is not None and not stopping.is_set():
        unit, future = job
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(task(unit))
        except BaseException as exc:
            future.set_exception(exc)
        del job, unit, future  # hold no block while waiting for the next unit
