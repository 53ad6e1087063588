"""Saying, while it waits, what a call to a bucket is waiting on.

A server that hangs leaves a call silent until its try times out (a minute of silence on the
connection, see ``Retries``) and the first retry is warned about; a stream reading through it
just stops. So every call of an ObjectStore is watched from its start to its end, its retries
included (``@retried``, objects.py): one thread per process looks at the calls in flight, and
a call from which nothing has come (or gone) for ``SLOW_CALL_S`` is said at WARNING, naming
the object's URL, what the call does and how long it has waited, and again every
``SLOW_CALL_EVERY_S`` while it lasts. Transfers report the bytes they move (``progress``), so
a large chunk coming slowly but steadily is not taken for a hung server. Calls to one store
that wait together are one line (the one silent longest, and how many others wait with it):
eight fetches stuck on one server say it once. A call that was said says at INFO when it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

from yogadl_plus import lifecycle

__all__ = ["SLOW_CALL_EVERY_S", "SLOW_CALL_S", "progress", "waiting_on"]

log = logging.getLogger(__name__)

#: A call to a bucket from which nothing has come for this many seconds is said at WARNING...
SLOW_CALL_S = 5.0
#: ... and again this often while it waits (at most one line per store at a time).
SLOW_CALL_EVERY_S = 30.0


@dataclasses.dataclass
class _Call:
    store: str  # the store's URL
    what: str  # "download of s3://bucket/prefix/d/v/b-1/chunk-00003.mdb"
    began: float
    last: float  # when it last moved bytes (or began)
    said: bool = False

    def moved(self, nbytes: int = 0) -> None:
        """Bytes came or went (from any thread): the server is not silent."""
        self.last = time.monotonic()


class _Watch:
    """The calls in flight in this process, and the thread that says which ones wait long."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls: dict[int, _Call] = {}
        self._per_store: Counter[str] = Counter()
        self._said_at: dict[str, float] = {}  # store -> when a line last named it
        self._numbers = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = math.inf

    @contextlib.contextmanager
    def watching(self, store: str, what: str) -> Iterator[_Call]:
        now = time.monotonic()
        call = _Call(store, what, now, now)
        with self._cond:
            number = next(self._numbers)
            self._calls[number] = call
            self._per_store[store] += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="yogadl-plus-waiting", daemon=True
                )
                self._thread.start()
            if call.began + SLOW_CALL_S < self._wake_at:
                self._cond.notify()
        calls = _CURRENT.__dict__.setdefault("calls", [])
        calls.append(call)
        try:
            yield call
        finally:
            calls.pop()
            with self._cond:
                del self._calls[number]
                self._per_store[store] -= 1
                if not self._per_store[store]:  # its next wait is said as early as this one
                    del self._per_store[store]
                    self._said_at.pop(store, None)
            if call.said:
                log.info("%s: went on after %.1f s", what, time.monotonic() - call.began)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                lines = self._due(now)
                if not lines:
                    self._cond.wait(None if self._wake_at == math.inf else self._wake_at - now)
                    continue
            for line in lines:  # (outside the lock: a handler may be slow)
                log.warning("%s", line)

    def _due(self, now: float) -> list[str]:
        """The lines to say now, one per store whose turn it is; sets when to look again.
        Under the lock."""
        silent: dict[str, _Call] = {}  # per store, the call silent longest
        waiting: Counter[str] = Counter()
        for call in self._calls.values():
            last = call.last  # (moved on by transfers, without the lock)
            if now - last >= SLOW_CALL_S:
                waiting[call.store] += 1
            first = silent.get(call.store)
            if first is None or last < first.last:
                silent[call.store] = call
        lines = []
        self._wake_at = math.inf
        for store, call in silent.items():
            last = call.last
            due = max(last + SLOW_CALL_S, self._said_at.get(store, -math.inf) + SLOW_CALL_EVERY_S)
            if due <= now:
                call.said = True
                self._said_at[store] = now
                due = now + SLOW_CALL_EVERY_S
                lines.append(_line(call, now - last, now - call.began, waiting[store] - 1))
            self._wake_at = min(self._wake_at, due)
        return lines


def _line(call: _Call, silent: float, waited: float, others: int) -> str:
    since = f" ({waited:.1f} s since it began)" if waited - silent >= 0.1 else ""
    with_others = f"; {others} other calls to {call.store} wait too" if others > 0 else ""
    return (
        f"{call.what}: nothing from the server for {silent:.1f} s{since}{with_others}; "
        "waiting on (until it answers, or retry_timeout passes)"
    )


_WATCH = _Watch()
# The calls this thread is in (innermost last), for ``progress``.
_CURRENT = threading.local()


def waiting_on(store: str, what: str) -> contextlib.AbstractContextManager[object]:
    """Watch a call to ``store`` (its URL) for the block: ``what`` says what it does and to
    which object ("download of s3://bucket/prefix/key"), in the lines said while it waits."""
    return _WATCH.watching(store, what)


def progress() -> Callable[[int], None]:
    """What a transfer of the call this thread is in calls with the bytes it moves, from any
    thread (a client's transfer threads too), so that a slow transfer is not said to wait on
    a silent server."""
    calls = getattr(_CURRENT, "calls", None)
    return calls[-1].moved if calls else _no_call


def _no_call(nbytes: int) -> None:
    """Bytes moved outside a watched call: nobody to tell."""


def _forget_after_fork() -> None:
    """In a forked child: the parent's watching thread is not here, nor its calls."""
    global _WATCH
    _WATCH = _Watch()


lifecycle.on_fork(after_in_child=_forget_after_fork)
