"""What every kind of worker provides: the task they run, and the methods a pool drives them by.

Workers run a ``Task`` on units and hand results back in submission order. A new kind of worker
(threads.py, processes.py) is one module with a ``Workers`` subclass, named in pool.py's
``KINDS``.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["GRACE_SECONDS", "Task", "Workers"]

# How long a worker asked to stop may take to finish the unit it is on before it is ended.
GRACE_SECONDS = 2.0


class Task(Protocol):
    """What a pool runs on each unit, and how its errors name a unit (stream/reader.py)."""

    def __call__(self, unit: Any) -> Any: ...

    def describe(self, unit: Any) -> str:
        """The unit's positions and records, as error messages name them."""
        ...

    def unpicklable(self, unit: Any, result: Any, error: Exception) -> Exception:
        """The error for a result that cannot be sent back from a worker process."""
        ...

    def decode_into(self, allocate: Any) -> None:
        """In a worker process: make big results with ``allocate`` (the worker's ring's
        ``empty``), so that handing them over copies nothing more."""
        ...


class Workers:
    """Workers running a task: units in with submit(), results out in order.

    Made as ``Kind(task, num_workers, start_method)`` (``start_method``: how processes are
    started, for kinds that start any), started at once.
    """

    closed = False
    owner = 0  # the process that started them: a forked child's copy is not its own

    def __init__(self, task: Task, num_workers: int, start_method: str) -> None:
        raise NotImplementedError

    def submit(self, unit: Any) -> Any:
        """Start work on ``unit``; what comes back is the ticket for its result."""
        raise NotImplementedError

    def result(self, ticket: Any, unit: Any) -> Any:
        """The result of the ticket's unit (waiting for it), or the error it raised."""
        raise NotImplementedError

    def cancel(self, tickets: list[Any]) -> None:
        """Drop the work of units whose results nobody will ask for."""
        raise NotImplementedError

    def stop(self) -> None:
        """Ask every worker to leave after the unit it is on; returns at once."""
        raise NotImplementedError

    def finish(self, deadline: float) -> None:
        """After stop(): wait for the workers to leave, until ``deadline`` (time.monotonic)."""
        raise NotImplementedError
