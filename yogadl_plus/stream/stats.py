"""Where a stream's time goes: items and bytes handed out, and the seconds spent reading,
decoding, in predicates and transforms, batching, waiting on workers and in the consumer.

The boundary's work is timed where a block is read (inline, in a worker thread or in a worker
process) and travels back with the block (``Block.work``); the stream adds it up as blocks
arrive, and times the rest in its own thread. Nothing is timed per record: a few clock reads
per block (hundreds of records) and per batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from yogadl_plus.stream.prometheus import exposition
from yogadl_plus.stream.timings import Timings
from yogadl_plus.stream.verdict import bottleneck as verdict_of
from yogadl_plus.stream.verdict import summary as summary_of

__all__ = [
    "TIMED",
    "WORK",
    "StatsCounter",
    "StreamStats",
    "Work",
    "add_work",
    "new_work",
    "time_epoch",
]

# The kinds of boundary work a block's ``work`` array times, in its order.
WORK = ("reading", "decoding", "predicates", "transforms")
READING, DECODING, PREDICATES, TRANSFORMS = range(len(WORK))
# Every kind of time StreamStats reports.
TIMED = (*WORK, "batching", "waiting_on_workers", "in_consumer")


# (A list, not an array: a block adds to it a few times, and numpy's scalar arithmetic costs
# several times Python's.)
Work = list[float]


def new_work() -> Work:
    """Seconds of each kind of work (WORK) for one block: zeros to add to."""
    return [0.0] * len(WORK)


def add_work(into: Work, work: Work) -> None:
    """Add ``work`` to ``into``, kind by kind."""
    for kind, seconds in enumerate(work):
        into[kind] += seconds


@dataclass(frozen=True)
class StreamStats(Timings):
    """What ``stream.stats()`` returns: the work since the stream first began an epoch, or
    since ``stream.reset_stats()``.

    ``items`` are the records (or n-gram windows) handed out, in ``batches`` when the stream
    batches (0 when it does not).

    ``seconds`` is the wall time since then. ``reading`` (records out of the cache, with their
    copies), ``decoding`` (into arrays or records), ``predicates`` and ``transforms`` are the
    boundary's work; with workers they are summed over the workers, so together they may
    exceed ``seconds``. ``batching`` is putting batches together in the consuming thread,
    ``waiting_on_workers`` the time that thread waited for a worker's result, and
    ``in_consumer`` the rest of ``seconds``: the time between items that the code consuming
    them took (training, and any wait before it asked for the next item). ``bytes`` are the
    decoded bytes of the records handed out (before a transform; a str counts its length), at
    the average of the blocks read.
    """

    @property
    def bottleneck(self) -> str:
        """What limits the run: "consumer" (not data-bound: the code using the items), or the
        loader's costliest work, "read", "decode", "predicate" or "transform", or "workers"
        (waiting on workers that were not busy). See stream/verdict.py."""
        return verdict_of(self)

    def summary(self) -> str:
        """One sentence with the verdict, the shares of time behind it and what to do:
        "data-bound 41% of the time; transform is 78% of the loader's work: add num_workers
        ..."."""
        return summary_of(self)

    def to_prometheus(self, labels: Mapping[str, str] | None = None) -> str:
        """These stats in Prometheus' text exposition format, each sample labelled with
        ``labels`` (e.g. ``{"rank": "3"}``); names follow Grain's where Grain exports the same
        measure (see stream/prometheus.py)."""
        return exposition(self, labels)

    def as_dict(self) -> dict[str, float]:
        """The fields and the two rates, for JSON or a log line."""
        out: dict[str, float] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["items_per_s"] = self.items_per_s
        out["bytes_per_s"] = self.bytes_per_s
        return out

    def __str__(self) -> str:
        batches = f" in {self.batches:,} batches" if self.batches else ""
        parts = [
            f"{self.items:,} items{batches}, {self.bytes / 2**20:,.1f} MiB in {self.seconds:.3f} s "
            f"({self.items_per_s:,.0f} items/s, {self.bytes_per_s / 2**20:,.1f} MiB/s)"
        ]
        parts += [f"{name.replace('_', ' ')} {getattr(self, name):.3f} s" for name in TIMED]
        return "; ".join(parts)


class StatsCounter:
    """The running sums behind ``stream.stats()``, added to by the thread consuming the
    stream; ``snapshot()`` may be taken from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._began: float | None = None
        self.items = 0
        self.batches = 0
        self._received = 0  # items in the blocks that arrived, and their decoded bytes
        self._received_bytes = 0
        self._work = new_work()
        self.batching = 0.0
        self.waiting = 0.0
        self._own = 0.0  # the stream's own time in the consuming thread

    def reset(self) -> None:
        with self._lock:
            self.__init__()  # type: ignore[misc]

    def begin(self) -> None:
        """An epoch starts being read: the clock starts, if it has not."""
        if self._began is None:
            self._began = time.perf_counter()

    def add_block(self, items: int, nbytes: int, work: Work, seconds: float, waited: bool) -> None:
        """A block of ``items`` (``nbytes`` decoded) arrived after ``seconds`` in the consuming
        thread (its work inline, or a wait for a worker when ``waited``); ``work`` is what
        reading it took."""
        # (No lock: one thread consumes a stream; a snapshot taken meanwhile from another
        # may be a block behind, which is all a lock here would buy, at a third of the cost.)
        self._received += items
        self._received_bytes += nbytes
        add_work(self._work, work)
        self._own += seconds
        if waited:
            self.waiting += seconds

    def add_batching(self, seconds: float) -> None:
        self.batching += seconds
        self._own += seconds

    def handed(self, items: int, batches: int = 0) -> None:
        self.items += items
        self.batches += batches

    def snapshot(self, extra_items: int = 0) -> StreamStats:
        """The stats now; ``extra_items`` were handed out since the last ``handed()``."""
        with self._lock:
            seconds = 0.0 if self._began is None else time.perf_counter() - self._began
            reading, decoding, predicates, transforms = self._work
            items = self.items + extra_items
            # Bytes at the average of the blocks read: exact for records of one size, and
            # free of any count per item or per batch.
            per_item = self._received_bytes / self._received if self._received else 0.0
            return StreamStats(
                items=items,
                batches=self.batches,
                bytes=round(items * per_item),
                seconds=seconds,
                reading=reading,
                decoding=decoding,
                predicates=predicates,
                transforms=transforms,
                batching=self.batching,
                waiting_on_workers=self.waiting,
                in_consumer=max(0.0, seconds - self._own),
            )


def time_epoch(
    stream: Any, epoch: int, advance: Callable[[int], object] | None = None
) -> dict[str, Any]:
    """Run the stream's next epoch, doing nothing with its items, and measure it: records,
    batches and decoded bytes as ``stream.stats()`` counts them (nothing is counted in the
    loop, which would slow down what is measured), the time to the first item, and where the
    epoch's time went (``"time"``: TIMED name -> seconds). What ``yogadl-plus bench`` and the
    demo report. ``advance(1)`` is called per item (a progress bar)."""
    batched = stream.batch_size is not None
    before = stream.stats()
    started = time.perf_counter()
    first = None
    for _ in stream:
        if first is None:
            first = time.perf_counter() - started
        if advance is not None:
            advance(1)
    seconds = time.perf_counter() - started
    after = stream.stats()
    records = after.items - before.items
    batches = after.batches - before.batches
    return {
        "epoch": epoch,
        "records": records,
        "batches": batches if batched else None,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "batches_per_s": batches / seconds if batched else None,
        "mb_per_s": (after.bytes - before.bytes) / 1e6 / seconds,
        "first_item_s": first,
        "time": {name: getattr(after, name) - getattr(before, name) for name in TIMED},
    }
