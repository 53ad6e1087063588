"""What a worker process does to itself as it starts: end when its parent does, skip the
objects it inherited in garbage collection, and keep the memory it frees for its next results.
Stream workers and the torch face's DataLoader workers both start so."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

__all__ = ["ParentWatch", "keep_freed_memory", "skip_inherited_objects"]

# How often a worker process checks that its parent is still there (where no signal tells it).
_WATCH_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_ORPHANED = 70  # the exit status of a worker that ended because its parent died


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
