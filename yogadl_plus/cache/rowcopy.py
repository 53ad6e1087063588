"""Stored values copied into the rows of a batch, by two threads when the batch is big.

A batch of big records (64 images of 1 MiB: 64 MiB) does not fit the CPU's caches, so its copy
runs at the speed one core can write memory it has to read first: 0.43-0.50x of a plain memcpy
of the same size here, which glibc does with stores that skip the cache. numpy copies without
the GIL, so a second thread copying half of the rows adds a second core's bandwidth (0.61-0.67x
of memcpy for 1-4 MiB values: docs/performance.md). Smaller batches are copied by the calling
thread alone: a hand-over costs more than it gains there.

The values are memoryviews into a chunk's map, valid in the reading thread until its next read.
The caller waits for the helper's half before it returns, so they stay valid throughout.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from yogadl_plus import lifecycle

__all__ = ["PARALLEL_BYTES", "copy_rows"]

#: Batches at least this big are copied by two threads (where the process may use two CPUs).
PARALLEL_BYTES = 16 << 20

_lock = threading.Lock()
_helper: ThreadPoolExecutor | None = None


def copy_rows(
    rows: np.ndarray, values: Sequence[memoryview | bytes], start: int, stop: int
) -> None:
    """``rows[j] = values[j][start:stop]`` for every j (``rows``: uint8, one row per value,
    ``stop - start`` bytes each; the values' lengths already checked)."""
    n = len(values)
    helper = _pool() if n > 1 and rows.nbytes >= PARALLEL_BYTES else None
    if helper is None:
        # (Slices of memoryviews: less work per row than numpy's, for rows of 64 KiB.)
        target = rows.data.cast("B")
        size = stop - start
        for j, value in enumerate(values):
            target[j * size : (j + 1) * size] = value[start:stop]
        return
    half = n // 2
    theirs: Future[None] = helper.submit(_copy, rows, values, start, stop, 0, half)
    try:
        _copy(rows, values, start, stop, half, n)
    finally:
        theirs.result()  # (also when ours failed: the views must outlive the helper's copy)


def _copy(
    rows: np.ndarray,
    values: Sequence[memoryview | bytes],
    start: int,
    stop: int,
    first: int,
    last: int,
) -> None:
    size = stop - start
    for j in range(first, last):
        np.copyto(rows[j], np.frombuffer(values[j], np.uint8, size, start))


def _pool() -> ThreadPoolExecutor | None:
    """The helper thread's pool, made on first use; None where this process may use one CPU."""
    global _helper
    with _lock:
        if _helper is None:
            if len(os.sched_getaffinity(0)) < 2:
                return None
            _helper = ThreadPoolExecutor(1, thread_name_prefix="yogadl-plus-copy")
        return _helper


def _forget_helper_after_fork() -> None:
    # A forked child has the parent's pool object but not its thread (work sent to it would
    # wait forever), and perhaps a copy of the lock taken by a thread it does not have.
    global _helper, _lock
    _helper = None
    _lock = threading.Lock()


lifecycle.on_fork(after_in_child=_forget_helper_after_fork)
