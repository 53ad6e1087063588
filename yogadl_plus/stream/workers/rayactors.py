"""Ray actors as workers (``worker_type="ray"``): the boundary's work on the cluster that
``ray.init()`` joined.

Each actor gets the task (the stream's reader: its settings, transform and predicate, and the
DataRefs, which pickle as where to open them) once, as it starts, and opens the version itself,
from the bucket or a shared filesystem; after that only units (a run of positions and the
records they read) go out and results come back. Units go to the actors in turn and results
are taken in submission order (pool.py), so the output is the thread workers', item for item.

An actor that dies (its process killed, its node lost) is replaced by a new one, and the units
it held are run again there: a unit is a pure function of the position, so its result is the
same. A unit whose actor dies ``_DEATHS_PER_UNIT`` times is WorkerDied, naming it.

Actors take Ray's default resources (a CPU to be placed, none once running), so that any number
of them start on the cluster there is, as many as the stream asks for (an actor waiting for a
CPU that never frees would stall the stream): for I/O-bound transforms more actors than CPUs
pay. A result awaited longer than ``_WARN_EVERY`` seconds is said in a warning, every time.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from typing import Any

from yogadl_plus.errors import TransformError, WorkerDied
from yogadl_plus.stream.workers.base import Task, Workers

__all__ = ["RayWorkers"]

log = logging.getLogger(__name__)

# A unit whose actor died this many times is not tried again: it is what kills them.
_DEATHS_PER_UNIT = 3
# Waiting for a result: a warning this often (seconds), naming the unit.
_WARN_EVERY = 30.0


class _Ticket:
    """A unit's work in flight: which actor has it, and the reference to its result."""

    __slots__ = ("actor", "deaths", "ref")

    def __init__(self, actor: int, ref: Any) -> None:
        self.actor = actor
        self.ref = ref
        self.deaths = 0


class RayWorkers(Workers):
    """Ray actors running the task, on the cluster ``ray.init()`` joined."""

    def __init__(self, task: Task, num_workers: int, start_method: str) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError(
                "worker_type='ray' runs the workers on the Ray cluster this process joined: "
                "call ray.init(...) first (ray.init(address='auto') for a running cluster)"
            )
        self.owner = os.getpid()
        self._ray = ray
        self._actor_class = ray.remote(_Actor)
        self._local_task = task
        try:
            self._task = ray.put(task)  # (serialized once, for every actor)
        except Exception as exc:
            raise TransformError(
                "the stream's reader cannot be sent to Ray actors (its transform, predicate or "
                f"skip list must pickle, as for worker_type='process' with spawn): {exc}"
            ) from exc
        self._actors = [self._start() for _ in range(num_workers)]
        self._turn = 0
        self._killing: threading.Thread | None = None

    def _start(self) -> Any:
        return self._actor_class.remote(self._task)

    def submit(self, unit: Any) -> _Ticket:
        k = self._turn
        self._turn = (k + 1) % len(self._actors)
        return _Ticket(k, self._actors[k].run.remote(unit))

    def result(self, ticket: _Ticket, unit: Any) -> Any:
        ray = self._ray
        waited = 0.0
        while True:
            try:
                return pickle.loads(ray.get(ticket.ref, timeout=_WARN_EVERY))
            except ray.exceptions.GetTimeoutError:
                waited += _WARN_EVERY
                log.warning(
                    "waited %.0f s for a Ray worker's result (%s): a slow transform, or a "
                    "cluster without room for the actors (ray.available_resources())",
                    waited,
                    self._describe(unit),
                )
            except ray.exceptions.RayTaskError as exc:
                # The task's own error (a TransformError naming the record), raised as itself.
                cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                raise cause from None
            except ray.exceptions.RayActorError as exc:
                ticket.deaths += 1
                if ticket.deaths >= _DEATHS_PER_UNIT:
                    raise WorkerDied(
                        f"a Ray actor died {ticket.deaths} times running "
                        f"{self._describe(unit)}: {exc}"
                    ) from None
                self._replace(ticket.actor, exc)
                ticket.ref = self._actors[ticket.actor].run.remote(unit)

    def _replace(self, k: int, exc: Exception) -> None:
        """A new actor in place of actor ``k``, if that one is dead (another unit of it may
        have replaced it already)."""
        ray = self._ray
        try:
            ray.get(self._actors[k].ping.remote(), timeout=_WARN_EVERY)
            return
        except ray.exceptions.GetTimeoutError:
            return  # alive, busy with the units before: result() warns while it waits
        except ray.exceptions.RayActorError:
            pass
        log.warning("a Ray worker died (%s): starting another; its units run again", exc)
        self._actors[k] = self._start()

    def _describe(self, unit: Any) -> str:
        return str(self._local_task.describe(unit))

    def cancel(self, tickets: list[_Ticket]) -> None:
        # Dropped, not ray.cancel()ed: cancelling an actor's queued tasks stalled its next ones
        # for about 30 s. The actors finish these few units (at most ``prefetch``) unread.
        for ticket in tickets:
            ticket.ref = None

    def stop(self) -> None:
        if self.closed:
            return
        self.closed = True
        # ray.kill waits for Ray's own event loop. A stream dropped while Ray's loop runs
        # Python (a garbage collection runs finalizers on whichever thread allocates) would
        # stop its workers there: the loop waited for itself, and the driver hung for good,
        # down to ray.shutdown(). So the actors are killed on a thread of their own, which
        # finish() waits for.
        killing = threading.Thread(
            target=_kill, args=(self._ray, list(self._actors)), name="yogadl-plus-ray-stop"
        )
        killing.daemon = True
        try:
            killing.start()
        except RuntimeError:  # (no new threads while the interpreter shuts down)
            _kill(self._ray, self._actors)
            return
        self._killing = killing

    def finish(self, deadline: float) -> None:
        # ray.kill ends an actor, stuck or not: only the kills themselves are waited for.
        if self._killing is not None:
            self._killing.join(max(0.0, deadline - time.monotonic()))


def _kill(ray: Any, actors: list[Any]) -> None:
    """End the Ray actors ``actors``, stuck in a unit or not."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # (a cluster already shut down)
            log.debug("could not end a Ray worker", exc_info=True)


class _Actor:
    """One Ray worker: the task, unpickled once."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def run(self, unit: Any) -> bytes:
        # Pickled here, not by Ray: a result that cannot be sent back is a TransformError
        # naming the record, and the caller gets arrays it may write to.
        result = self.task(unit)
        try:
            return pickle.dumps(result, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise self.task.unpicklable(unit, result, exc) from exc

    def ping(self) -> bool:
        return True
