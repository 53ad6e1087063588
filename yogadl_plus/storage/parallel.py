"""Many objects moved at once on a few threads, the first failure ending them all."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor, wait
from typing import Any, TypeVar

__all__ = ["in_threads", "run_all"]

T = TypeVar("T")


def run_all(pool: Executor, work: Callable[[T], Any], jobs: Sequence[T]) -> None:
    """``work(job)`` for every job, on ``pool``. The first error cancels the jobs that have not
    started, waits for those running (none may go on once the caller moves on: they may write
    into a file it closes next), and is raised."""
    futures = [pool.submit(work, job) for job in jobs]
    try:
        for future in futures:
            future.result()
    except BaseException:
        for future in futures:
            future.cancel()
        wait(futures)
        raise


def in_threads(work: Callable[[T], Any], jobs: Sequence[T], threads: int) -> None:
    """``work(job)`` for every job, in at most ``threads`` threads (in this one for a single
    job or thread); the first error ends them as ``run_all`` does."""
    if len(jobs) <= 1 or threads == 1:
        for job in jobs:
            work(job)
        return
    with ThreadPoolExecutor(min(threads, len(jobs))) as pool:
        run_all(pool, work, jobs)
