"""Worker processes (``worker_type="process"``): each gets units through a pipe, runs the task
and sends results back in the order it got them, large ones through its shared ring (ring.py).

A worker ends between units when asked, by itself after ``GRACE_SECONDS`` if a unit does not
end, and whenever its parent process dies (child.py). Every failure reaches the caller as
``WorkerDied`` or as the task's own error, naming the unit.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import signal
import struct
import sys
import threading
import time
from typing import Any

from yogadl_plus import lifecycle
from yogadl_plus.errors import TransformError, WorkerDied
from yogadl_plus.stream.workers.base import GRACE_SECONDS, Task, Workers
from yogadl_plus.stream.workers.handoff import (
    ParentWatch,
    Sender,
    SharedRing,
    raised_from,
    start_worker,
    unpack,
    worker_rings,
)
from yogadl_plus.stream.workers.ring import Packed

__all__ = ["ProcessWorkers", "end_all"]

# Parent to worker: (kind, sequence number, unit).
_UNIT, _CANCEL, _STOP = range(3)
# Worker to parent: a header (sequence number, outcome), then the pickled result or error, or
# the pickled Packed of a result in the worker's ring.
_HEADER = struct.Struct("<qB")
_DONE, _FAILED, _SHARED = range(3)

# Worker processes started here, also those of pools dropped without close(): the exit handler
# ends any still running. Held until they end; a forked child forgets its parent's.
_PROCESSES: lifecycle.Registry[multiprocessing.process.BaseProcess] = lifecycle.Registry(
    "worker processes", weak=False
)
lifecycle.on_fork(after_in_child=_PROCESSES.clear)


def end_all() -> None:
    """End every worker process this process started that is still running."""
    for process in _PROCESSES:
        _end(process)


class ProcessWorkers(Workers):
    """Worker processes running the task, each with a pipe and a ring of its own."""

    def __init__(self, task: Task, num_workers: int, start_method: str) -> None:
        for process in _PROCESSES:  # (those of pools dropped without close() that ended since)
            if process.exitcode is not None:
                _PROCESSES.discard(process)
        context = multiprocessing.get_context(start_method)
        watch = ParentWatch.here(start_method)
        self.task = task
        self.owner = os.getpid()
        self._sent = 0  # sequence number of the last unit sent
        self._turn = 0
        self._workers: list[tuple[multiprocessing.process.BaseProcess, Any]] = []
        # Per worker, the sequence number of the unit it last began (written by the worker in
        # shared memory), and the units sent and not handed back yet: what a dead worker held.
        self._began: list[Any] = []
        self._in_flight: dict[int, Any] = {}
        # One ring per worker process, made before it starts; dropped with these workers (the
        # arrays handed out from it keep its memory until they are gone).
        self._rings: list[SharedRing | None] = worker_rings(num_workers)
        try:
            for k, ring in enumerate(self._rings):
                here, there = context.Pipe()
                began = context.RawValue("q", 0)
                self._began.append(began)
                process = context.Process(  # type: ignore[attr-defined]
                    target=_process_main,
                    args=(there, task, watch, ring, began),
                    name=f"yogadl_plus-worker-{k}",
                )
                try:
                    process.start()
                except (pickle.PicklingError, TypeError, AttributeError) as exc:
                    raise TypeError(
                        f"worker processes started by {start_method!r} get the stream's work "
                        f"(transform, predicate) pickled, and it cannot be: {exc}; make it a "
                        "module-level function, or use worker_start_method='fork' or "
                        "worker_type='thread'"
                    ) from exc
                finally:
                    there.close()
                _PROCESSES.add(process)
                self._workers.append((process, here))
        except BaseException:
            self.stop()
            self.finish(time.monotonic())
            raise

    def submit(self, unit: Any) -> tuple[int, int]:
        self._sent += 1
        k = self._turn
        self._turn = (k + 1) % len(self._workers)
        self._in_flight[self._sent] = unit
        try:
            self._workers[k][1].send((_UNIT, self._sent, unit))
        except OSError:
            pass  # it died: result() says so, after the results it handed back
        except BaseException:
            self.stop()  # interrupted (Ctrl-C) halfway through a message: the pipe is unusable
            raise
        return k, self._sent

    def result(self, ticket: tuple[int, int], unit: Any) -> Any:
        k, sequence = ticket
        try:
            while True:
                got, outcome = _HEADER.unpack(self._receive(k, unit))
                payload = self._receive(k, unit)
                self._in_flight.pop(got, None)
                if got == sequence:
                    break
                # Anything older is left from units cancelled when an earlier map was dropped.
                ring = self._rings[k]
                if outcome == _SHARED and ring is not None:
                    ring.discard(pickle.loads(payload))
        except WorkerDied:
            raise
        except BaseException:
            self.stop()  # interrupted (Ctrl-C) halfway through a message: the pipe is unusable
            raise
        if outcome == _FAILED:
            raise raised_from(payload, lambda: self.task.describe(unit))
        try:
            packed = pickle.loads(payload) if outcome == _SHARED else Packed(payload)
            return unpack(self._rings[k], packed)
        except Exception as exc:
            raise TransformError(
                f"the result of {self.task.describe(unit)} came back from the worker process "
                f"but cannot be unpickled here ({type(exc).__name__}: {exc})"
            ) from exc

    def _receive(self, k: int, unit: Any) -> bytes:
        process, conn = self._workers[k]
        # Waiting on the process too: a killed worker's results already sent are still read
        # first, then its death is told (and Ctrl-C interrupts this wait).
        if conn in multiprocessing.connection.wait([conn, process.sentinel]):
            try:
                return conn.recv_bytes()
            except (EOFError, OSError):
                pass
        process.join(1.0)
        code = process.exitcode
        if code is None:
            how = "its connection broke"
        elif code < 0:
            how = f"killed by {_signal_name(-code)}"
        else:
            how = f"exit status {code}"
        # The unit it was on, if it had not handed that one back (a result it finished may be
        # lost with it, unsent): else the one awaited.
        held = self._in_flight.get(self._began[k].value)
        where = (
            f"while on {self.task.describe(held)}"
            if held is not None
            else f"before handing back {self.task.describe(unit)}"
        )
        raise WorkerDied(
            f"worker process {process.pid} died ({how}) {where}: the items handed out so far "
            "are intact; resume from stream.offset, with fewer workers or a smaller prefetch if "
            "memory ran out"
        )

    def cancel(self, tickets: list[tuple[int, int]]) -> None:
        if self.closed or not tickets:
            return
        self._in_flight.clear()  # (every unit sent so far is cancelled)
        for _, conn in self._workers:
            _send_if_room(conn, (_CANCEL, self._sent, None))

    def stop(self) -> None:
        if self.closed:
            return
        self.closed = True
        if os.getpid() != self.owner:
            return  # a copy in a forked child: these workers are its parent's
        for _, conn in self._workers:
            _send_if_room(conn, (_STOP, 0, None))

    def finish(self, deadline: float) -> None:
        if os.getpid() != self.owner:
            return
        for process, _ in self._workers:
            process.join(max(0.0, deadline - time.monotonic()))
        for process, conn in self._workers:
            _end(process)
            conn.close()
        # What was handed out of the rings keeps its part of them alive until it is dropped.
        self._rings = [None] * len(self._rings)


def _send_if_room(conn: Any, message: Any) -> None:
    """Send a small control message unless sending would wait: a worker stuck without reading
    has a full pipe, and such a worker is ended after the grace period. (Polling for room is
    not enough: a pipe with some room can still make a whole message wait, and this is also
    called from a pool's ``__del__``, which must never block the thread the collector runs
    in.) The pipe is the owner's alone while it sends, so the flag is set only that long."""
    try:
        fd = conn.fileno()
        os.set_blocking(fd, False)
        try:
            conn.send(message)
        finally:
            os.set_blocking(fd, True)
    except (OSError, ValueError):
        pass  # no room (BlockingIOError), it is gone, or its connection closed


def _end(process: multiprocessing.process.BaseProcess) -> None:
    """End a worker process that did not leave when asked (terminate, then kill)."""
    if process.exitcode is None:
        process.terminate()
        process.join(1.0)
    if process.exitcode is None:
        process.kill()
        process.join(5.0)
    _PROCESSES.discard(process)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _process_main(
    conn: Any, task: Task, watch: ParentWatch, ring: SharedRing | None, began: Any
) -> None:
    """A worker process: runs units in the order they come, sends back results in that order."""
    # Ctrl-C is the caller's to handle: it stops the iteration and shuts the pool down. A
    # worker dying of it instead would break the pool under the caller's feet. SIGTERM is how
    # the caller ends a stuck worker: a handler inherited from the parent must not keep it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    start_worker(watch)
    sender = Sender(ring)
    sender.decode_into_ring(task)
    inbox: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()
    outbox: queue.SimpleQueue[tuple[int, int, bytes]] = queue.SimpleQueue()
    cancelled = [0]  # units up to this sequence number are not wanted any more
    # Units are taken off the pipe as they come, and results sent while the next unit runs, so
    # neither side's send ever waits for the other's work (which could deadlock both).
    for target, args in (
        (_receive_units, (conn, inbox, cancelled)),
        (_send_results, (conn, outbox)),
    ):
        threading.Thread(target=target, args=args, daemon=True).start()
    while (job := inbox.get()) is not None:
        sequence, unit = job
        if sequence <= cancelled[0]:
            continue
        began.value = sequence  # (so that the parent can name it if this process dies in it)
        outbox.put((sequence, *_outcome(task, unit, sender)))
        del job, unit


def _outcome(task: Task, unit: Any, sender: Sender) -> tuple[int, bytes]:
    try:
        result = task(unit)
    except BaseException as exc:
        return _FAILED, sender.failed(exc)
    try:
        packed = sender.pack(result)
    except Exception as exc:
        return _FAILED, sender.failed(task.unpicklable(unit, result, exc))
    if packed.shared:
        return _SHARED, pickle.dumps(packed, pickle.HIGHEST_PROTOCOL)
    return _DONE, packed.data


def _receive_units(
    conn: Any, inbox: queue.SimpleQueue[tuple[int, Any] | None], cancelled: list[int]
) -> None:
    while True:
        try:
            kind, sequence, unit = conn.recv()
        except (EOFError, OSError):
            kind = _STOP  # the parent closed its end, or is gone
        except Exception:
            kind = _STOP  # a message that does not unpickle: the pipe can no longer be read
        if kind == _UNIT:
            inbox.put((sequence, unit))
        elif kind == _CANCEL:
            cancelled[0] = sequence
        else:
            # Leave between units; a unit that does not end in the grace period is cut short.
            cancelled[0] = sys.maxsize
            inbox.put(None)
            time.sleep(GRACE_SECONDS)
            os._exit(0)


def _send_results(conn: Any, outbox: queue.SimpleQueue[tuple[int, int, bytes]]) -> None:
    while True:
        sequence, outcome, payload = outbox.get()
        try:
            conn.send_bytes(_HEADER.pack(sequence, outcome))
            conn.send_bytes(payload)
        except OSError:
            os._exit(0)  # the parent closed its end, or is gone
        del payload
