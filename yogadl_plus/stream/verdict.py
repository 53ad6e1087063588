"""Why is this run data-bound: a verdict from a stream's stats, and what to do about it.

The consuming thread's time splits into the time it spent getting items (reading inline, or
waiting for a worker, and batching) and the rest, spent in the code that uses them. Below a
fifth of the wall time getting items, the stream is not what limits the run: the verdict is
``"consumer"``. Otherwise it names the boundary's work that takes most of the loader's time
(``"read"``, ``"decode"``, ``"predicate"``, ``"transform"``), or ``"workers"`` when the
consuming thread waited on workers longer than all their work took (they were not busy: the
hand-over is the cost).

Workers are advised only where they can help: not where the run was too short to tell (a pool
costs its start and a hand-over per unit, as much as a run of a fraction of a second takes),
nor where the loader's work is already a few microseconds an item (for records that cheap, a
worker's hand-over costs about what reading them does, and threads share one interpreter
lock). There the advice is what else to do, and why workers are not it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from yogadl_plus.stream.timings import Timings

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
# Where workers cannot help: what else there is to do.
_WITHOUT_WORKERS = {
    "read": "check the disk or the bucket (docs/stats.md)",
    "decode": "decode fewer fields (fields=)",
    "predicate": "vectorize the predicate (in_lambda(..., vectorized=True))",
    "transform": "make the transform cheaper",
}
# A run shorter than this (seconds) is too short to tell what workers would do...
_TOO_SHORT_S = 0.2
# ... and loader work under this per item (seconds) is too little for a worker to take over.
_CHEAP_ITEM_S = 10e-6


def bottleneck(stats: Timings) -> str:
    """The verdict (one of VERDICTS) for ``stats``: see the module's docstring."""
    getting = _getting(stats)
    if stats.seconds <= 0 or getting / stats.seconds < _DATA_BOUND:
        return "consumer"
    work = _work(stats)
    if stats.waiting_on_workers > getting / 2 and sum(work.values()) < stats.waiting_on_workers:
        return "workers"
    return max(work, key=lambda kind: work[kind])


def summary(stats: Timings) -> str:
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
    why_not = _why_workers_cannot_help(stats, sum(work.values()))
    if why_not is not None:
        advice = f"{_WITHOUT_WORKERS[verdict]}; workers would not help: {why_not}"
    elif stats.waiting_on_workers > 0:
        advice = _WORKERS_ADVICE
    else:
        advice = _ADVICE[verdict]
    return (
        f"data-bound {share:.0%} of the time; {verdict} is {part:.0%} of the loader's work: "
        f"{advice}"
    )


def _why_workers_cannot_help(stats: Timings, work: float) -> str | None:
    """Why more workers would not make this run faster (None: they may)."""
    if stats.seconds < _TOO_SHORT_S:
        return (
            f"the run took {stats.seconds:.2f} s, too short for them to pay off or to tell "
            "(measure more epochs)"
        )
    per_item = work / stats.items if stats.items else 0.0
    if per_item < _CHEAP_ITEM_S:
        return (
            f"the loader's work is {per_item * 1e6:.1f} µs an item, about what handing it "
            "over would cost"
        )
    return None


def _getting(stats: Timings) -> float:
    """Seconds the consuming thread spent getting items, not using them."""
    return max(0.0, stats.seconds - stats.in_consumer)


def _work(stats: Timings) -> dict[str, float]:
    return {
        "read": stats.reading,
        "decode": stats.decoding + stats.batching,
        "predicate": stats.predicates,
        "transform": stats.transforms,
    }
