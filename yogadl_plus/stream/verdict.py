"""Why is this run data-bound: a verdict from a stream's stats, and what to do about it.

The consuming thread's time splits into the time it spent getting items (reading inline, or
waiting for a worker, and batching) and the rest, spent in the code that uses them. Below a
fifth of the wall time getting items, the stream is not what limits the run: the verdict is
``"consumer"``. Otherwise it names the boundary's work that takes most of the loader's time
(``"read"``, ``"decode"``, ``"predicate"``, ``"transform"``), or ``"workers"`` when the
consuming thread waited on workers longer than all their work took (they were not busy: the
hand-over is the cost).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from yogadl_plus.stream.stats import StreamStats

__all__ = ["VERDICTS", "bottleneck", "summary"]

#: Every verdict, ``StreamStats.bottleneck``'s values.
VERDICTS = ("consumer", "storage", "read", "decode", "predicate", "transform", "workers")
# Below this share of the wall time spent getting items, the consumer is what limits the run.
_DATA_BOUND = 0.2
_ADVICE = {
    "read": "read ahead with num_workers, and check the disk or the bucket (docs/stats.md)",
    "decode": "decode fewer fields (fields=) or add num_workers",
    "predicate": "vectorize the predicate (in_lambda(..., vectorized=True)) or add num_workers",
    "transform": "add num_workers (worker_type='process' for transforms in Python)",
    "workers": "hand over fewer, bigger units (a larger batch_size), or fewer workers",
}
# With workers already reading, the advice is for them.
_WORKERS_ADVICE = "more workers, or worker_type='process' (threads share one interpreter lock)"


def bottleneck(stats: StreamStats) -> str:
    """The verdict (one of VERDICTS) for ``stats``: see the module's docstring."""
    getting = _getting(stats)
    if stats.seconds <= 0 or getting / stats.seconds < _DATA_BOUND:
        return "consumer"
    work = _work(stats)
    if stats.waiting_on_workers > getting / 2 and sum(work.values()) < stats.waiting_on_workers:
        return "workers"
    return max(work, key=lambda kind: work[kind])


def summary(stats: StreamStats) -> str:
    """One sentence: how data-bound the run is, what the loader's time went to, what to do."""
    verdict = bottleneck(stats)
    share = _getting(stats) / stats.seconds if stats.seconds > 0 else 0.0
    if verdict == "consumer":
        return (
            f"not data-bound: getting items took {share:.0%} of the time; the code using them "
            "(the training step) is what limits the run"
        )
    if verdict == "workers":
        return (
            f"data-bound {share:.0%} of the time, waiting on workers that were not busy: "
            f"{_ADVICE['workers']}"
        )
    work = _work(stats)
    part = work[verdict] / sum(work.values())
    advice = _WORKERS_ADVICE if stats.waiting_on_workers > 0 else _ADVICE[verdict]
    return (
        f"data-bound {share:.0%} of the time; {verdict} is {part:.0%} of the loader's work: "
        f"{advice}"
    )


def _getting(stats: StreamStats) -> float:
    """Seconds the consuming thread spent getting items, not using them."""
    return max(0.0, stats.seconds - stats.in_consumer)


def _work(stats: StreamStats) -> dict[str, float]:
    return {
        "read": stats.reading,
        "decode": stats.decoding + stats.batching,
        "predicate": stats.predicates,
        "transform": stats.transforms,
    }
