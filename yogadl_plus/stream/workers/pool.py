"""Work done ahead of the caller in threads or processes, handed back in submission order.

The order of results never depends on the number of workers or on timing: units are submitted
in order and their results are taken in that order (process workers get units in turn, and
each hands its results back in the order it got its units). At most ``prefetch`` units are in
flight, so memory stays bounded however fast the workers are.

Workers always stop. Asked to (``close()``, a dropped stream, the end of the program after the
loop ended or Ctrl-C), they leave between units; a process worker still busy after
``GRACE_SECONDS`` (a transform that never returns) ends itself, and is terminated by the
caller if even that fails. A process worker also ends when its parent process dies, however it
died: by a parent-death signal where Linux gives one, and everywhere by a thread that watches
its parent. Threads cannot be stopped in Python: thread workers are daemon threads, waited for
``GRACE_SECONDS``; one stuck in a transform runs on until the process exits, which does not
wait for it.

Every failure of a worker reaches the caller as ``WorkerDied`` or as the task's own error
(``TransformError`` for a transform), naming the unit (its positions and records).

A process worker hands large results (blocks of decoded arrays) back through a SharedRing of
its own (see shared_buffers): the arrays arrive in shared memory, and only the rest of the
result is pickled through its pipe.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import gc
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import select
import signal
import struct
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from yogadl_plus.errors import RemoteTraceback, TransformError, WorkerDied
from yogadl_plus.shared_buffers import SharedRing

__all__ = [
    "GRACE_SECONDS",
    "WORKER_TYPES",
    "OrderedPool",
    "ParentWatch",
    "Task",
    "WorkerDied",
    "decode_into",
    "error_payload",
    "keep_freed_memory",
    "raised_from",
    "skip_inherited_objects",
]

WORKER_TYPES = ("thread", "process")
# How long a worker asked to stop may take to finish the unit it is on before it is ended.
GRACE_SECONDS = 2.0
# How often a worker process checks that its parent is still there (where no signal tells it).
_WATCH_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_ORPHANED = 70  # the exit status of a worker that ended because its parent died

_LIVE_POOLS: weakref.WeakSet[OrderedPool] = weakref.WeakSet()


class Task(Protocol):
    """What a pool runs on each unit, and how its errors name a unit (see BlockReader)."""

    def __call__(self, unit: Any) -> Any: ...

    def describe(self, unit: Any) -> str:
        """The unit's positions and records, as error messages name them."""
        ...

    def unpicklable(self, unit: Any, result: Any, error: Exception) -> Exception:
        """The error for a result that cannot be sent back from a worker process."""
        ...


# --- a worker process ends when its parent does ---


@dataclass(frozen=True)
class ParentWatch:
    """How a worker process ends itself when its parent process dies: made in the parent
    (``ParentWatch.here``), started in the worker (``start()``)."""

    parent: int | None  # None when a fork server starts the worker: watch whoever it is then
    die_with_parent: bool

    @classmethod
    def here(cls, start_method: str) -> ParentWatch:
        """The watch for a worker that this thread is about to start with ``start_method``."""
        direct = start_method in ("fork", "spawn")
        # Linux sends the parent-death signal when the *thread* that started the worker ends,
        # not the process: only the main thread lasts as long as the process.
        main = threading.current_thread() is threading.main_thread()
        return cls(os.getpid() if direct else None, direct and main)

    def start(self) -> None:
        """In the worker: from now on, end this process (whatever it is doing) once the parent
        is gone."""
        if self.die_with_parent:
            _set_parent_death_signal()
        parent = os.getppid() if self.parent is None else self.parent
        if os.getppid() != parent:
            os._exit(_ORPHANED)  # the parent died before the watch began
        threading.Thread(
            target=_watch_parent, args=(parent,), name="yogadl_plus-parent-watch", daemon=True
        ).start()


def decode_into(ring: SharedRing, dataref: Any) -> None:
    """In a worker process: ``dataref`` decodes its big arrays straight into ``ring``, where
    its layout lets the caller choose where they go (a ``recycler`` with ``empty``), so that
    handing them over copies nothing more."""
    layout = getattr(dataref, "layout", None)
    if layout is not None and hasattr(layout, "recycler"):
        layout.recycler = ring


# glibc's mallopt parameters (<malloc.h>).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
# Freed memory a worker process keeps for its next results.
_KEPT_BYTES = 256 << 20


def skip_inherited_objects() -> None:
    """In a worker process: this process's garbage collector never walks the objects it
    inherited from its parent (``gc.freeze``). A parent that imported torch holds hundreds of
    thousands of them, and each full collection in a worker walked them all: stream workers
    reading small records spent half again as much CPU (docs/performance.md). What the worker
    itself makes is collected as usual."""
    gc.freeze()


def keep_freed_memory() -> None:
    """In a worker process: keep memory freed by one result for the next one.

    A worker frees each result once it is handed over, before it makes the next. With glibc's
    defaults, that frees the top of the heap (or a whole mapping, for a big array), which goes
    back to the system, and the next result faults every page in again: for a 24 MB batch,
    6,000 page faults, three times the cost of decoding it. Without mmap for large blocks and
    with a high trim threshold, the worker reuses the same pages; it keeps at most _KEPT_BYTES
    it does not use. Elsewhere than glibc, nothing changes.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_MAX, 0)
    mallopt(_M_TRIM_THRESHOLD, _KEPT_BYTES)


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the watching thread still ends the worker, within _WATCH_SECONDS


def _watch_parent(parent: int) -> None:
    # An orphan is adopted by another process: its parent id changes. os._exit from this
    # thread ends the process even while its main thread is stuck in a transform.
    while True:
        time.sleep(_WATCH_SECONDS)
        if os.getppid() != parent:
            os._exit(_ORPHANED)


# --- the pool ---


class _Workers:
    """Threads or processes running a task: units in with submit(), results out in order."""

    closed = False
    owner = 0  # the process that started them: a forked child's copy is not its own

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


class OrderedPool:
    """Runs ``task(unit)`` for a stream of units on ``num_workers`` threads or processes."""

    def __init__(
        self,
        task: Task,
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
        self.prefetch = max(1, prefetch if prefetch is not None else 2 * num_workers)
        if start_method is None:
            start_method = "fork" if sys.platform.startswith("linux") else "spawn"
        self.start_method = start_method
        self._workers: _Workers | None = None
        _LIVE_POOLS.add(self)

    def _started(self) -> _Workers:
        workers = self._workers
        if workers is None or workers.closed or workers.owner != os.getpid():
            if self.worker_type == "thread":
                workers = _ThreadWorkers(self.task, self.num_workers)
            else:
                workers = _ProcessWorkers(self.task, self.num_workers, self.start_method)
            self._workers = workers
        return workers

    def map(self, units: Iterable[Any]) -> Iterator[Any]:
        """Results of ``task`` over ``units``, in order; stops cleanly when dropped early."""
        pending: collections.deque[tuple[Any, _Workers, Any]] = collections.deque()
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

    def _next(self, pending: collections.deque[tuple[Any, _Workers, Any]]) -> Any:
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

    def _close(self, workers: _Workers) -> None:
        if workers is self._workers:
            self._workers = None
        workers.stop()
        workers.finish(time.monotonic() + GRACE_SECONDS)

    def __del__(self) -> None:
        # No waiting here: the workers leave by themselves (see _receive_units).
        workers = getattr(self, "_workers", None)
        if workers is not None:
            workers.stop()


@atexit.register
def _stop_workers_at_exit() -> None:
    # Registered after multiprocessing's own exit handler (imported above), so it runs first:
    # that one would wait for our worker processes forever if one were stuck.
    running = []
    for pool in list(_LIVE_POOLS):
        workers, pool._workers = pool._workers, None
        if workers is not None:
            workers.stop()
            running.append(workers)
    deadline = time.monotonic() + GRACE_SECONDS
    for workers in running:
        workers.finish(deadline)
    for process in _our_processes():
        _end(process)


# --- threads ---


class _ThreadWorkers(_Workers):
    def __init__(self, task: Task, num_workers: int) -> None:
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


# --- processes ---

# Parent to worker: (kind, sequence number, unit).
_UNIT, _CANCEL, _STOP = range(3)
# Worker to parent: a header (sequence number, outcome), then the pickled result or error, or
# the pickled Packed of a result in the worker's ring.
_HEADER = struct.Struct("<qB")
_DONE, _FAILED, _SHARED = range(3)

# Worker processes started here (by id, with the id of the process that started them), also
# those of pools dropped without close(): the exit handler ends any still running.
_PROCESSES: dict[int, tuple[int, multiprocessing.process.BaseProcess]] = {}


def _our_processes() -> list[multiprocessing.process.BaseProcess]:
    """Worker processes this process started (a forked child's registry lists its parent's)."""
    me = os.getpid()
    return [process for owner, process in list(_PROCESSES.values()) if owner == me]


class _ProcessWorkers(_Workers):
    def __init__(self, task: Task, num_workers: int, start_method: str) -> None:
        _forget_ended_processes()
        context = multiprocessing.get_context(start_method)
        watch = ParentWatch.here(start_method)
        self.task = task
        self.owner = os.getpid()
        self._sent = 0  # sequence number of the last unit sent
        self._turn = 0
        self._workers: list[tuple[multiprocessing.process.BaseProcess, Any]] = []
        # One ring per worker process, made before it starts; dropped with these workers (the
        # arrays handed out from it keep its memory until they are gone).
        self._rings: list[SharedRing | None] = []
        try:
            for k in range(num_workers):
                here, there = context.Pipe()
                ring = SharedRing.create()
                self._rings.append(ring)
                process = context.Process(  # type: ignore[attr-defined]
                    target=_process_main,
                    args=(there, task, watch, ring),
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
                _PROCESSES[id(process)] = (self.owner, process)
                self._workers.append((process, here))
        except BaseException:
            self.stop()
            self.finish(time.monotonic())
            raise

    def submit(self, unit: Any) -> tuple[int, int]:
        self._sent += 1
        k = self._turn
        self._turn = (k + 1) % len(self._workers)
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
                if got == sequence:
                    break
                # Anything older is left from units cancelled when an earlier map was dropped.
                if outcome == _SHARED:
                    self._ring(k).discard(pickle.loads(payload))
        except WorkerDied:
            raise
        except BaseException:
            self.stop()  # interrupted (Ctrl-C) halfway through a message: the pipe is unusable
            raise
        if outcome == _FAILED:
            raise raised_from(payload, lambda: self.task.describe(unit))
        try:
            if outcome == _SHARED:
                return self._ring(k).unpack(pickle.loads(payload))
            return pickle.loads(payload)
        except Exception as exc:
            raise TransformError(
                f"the result of {self.task.describe(unit)} came back from the worker process "
                f"but cannot be unpickled here ({type(exc).__name__}: {exc})"
            ) from exc

    def _ring(self, k: int) -> SharedRing:
        ring = self._rings[k]
        assert ring is not None, "a worker without a ring sent a result in one"
        return ring

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
        raise WorkerDied(
            f"worker process {process.pid} died ({how}) before handing back "
            f"{self.task.describe(unit)}: the items handed out so far are intact; resume from "
            "stream.offset, with fewer workers or a smaller prefetch if memory ran out"
        )

    def cancel(self, tickets: list[tuple[int, int]]) -> None:
        if self.closed or not tickets:
            return
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
    """Send a small control message unless the worker's pipe is full (a worker stuck without
    reading): sending would then block; such a worker is ended after the grace period."""
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLOUT)
            if not poller.poll(0):
                return
        conn.send(message)
    except (OSError, ValueError):
        pass  # it is gone, or its connection closed


def _end(process: multiprocessing.process.BaseProcess) -> None:
    """End a worker process that did not leave when asked (terminate, then kill)."""
    if process.exitcode is None:
        process.terminate()
        process.join(1.0)
    if process.exitcode is None:
        process.kill()
        process.join(5.0)
    _PROCESSES.pop(id(process), None)


def _forget_ended_processes() -> None:
    for process in _our_processes():
        if process.exitcode is not None:
            _PROCESSES.pop(id(process), None)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def error_payload(exc: BaseException) -> bytes:
    """``exc`` as bytes another process can send back, to be raised there by ``raised_from``
    (with its traceback, also when the error itself cannot be pickled)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        data: bytes | None = pickle.dumps(exc, pickle.HIGHEST_PROTOCOL)
    except Exception:
        data = None
    return pickle.dumps((data, f"{type(exc).__name__}: {exc}", text))


def raised_from(payload: bytes, what: Callable[[], str]) -> BaseException:
    """The error of an ``error_payload``, to raise here: the worker's own error where it can be
    unpickled, else a TransformError naming ``what()`` failed; the worker's traceback is its
    cause."""
    data, summary, text = pickle.loads(payload)
    exc: BaseException | None = None
    if data is not None:
        try:
            exc = pickle.loads(data)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = TransformError(
            f"a worker process failed on {what()} with {summary} (that error cannot be sent "
            "back as it is; its traceback is the cause)"
        )
    exc.__cause__ = RemoteTraceback(f'\n"""\n{text}"""')
    return exc


def _process_main(conn: Any, task: Task, watch: ParentWatch, ring: SharedRing | None) -> None:
    """A worker process: runs units in the order they come, sends back results in that order."""
    # Ctrl-C is the caller's to handle: it stops the iteration and shuts the pool down. A
    # worker dying of it instead would break the pool under the caller's feet. SIGTERM is how
    # the caller ends a stuck worker: a handler inherited from the parent must not keep it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    watch.start()
    skip_inherited_objects()
    keep_freed_memory()
    if ring is not None:
        for ref in getattr(task, "datarefs", ()):
            decode_into(ring, ref)
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
        outbox.put((sequence, *_outcome(task, unit, ring)))
        del job, unit


def _outcome(task: Task, unit: Any, ring: SharedRing | None) -> tuple[int, bytes]:
    try:
        result = task(unit)
    except BaseException as exc:
        return _FAILED, error_payload(exc)
    try:
        if ring is None:
            return _DONE, pickle.dumps(result, pickle.HIGHEST_PROTOCOL)
        packed = ring.pack(result)
        if packed.shared:
            return _SHARED, pickle.dumps(packed, pickle.HIGHEST_PROTOCOL)
        return _DONE, packed.data
    except Exception as exc:
        return _FAILED, error_payload(task.unpicklable(unit, result, exc))


def _receive_units(
    conn: Any, inbox: queue.SimpleQueue[tuple[int, Any] | None], cancelled: list[int]
) -> None:
    while True:
        try:
            kind, sequence, unit = conn.recv()
        except (EOFError, OSError):
            kind = _STOP  # the parent closed its end, or is gone
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
