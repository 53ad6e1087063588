"""Which chunks of a version read on demand stay open, and when the retired ones may go.

A read hands out memoryviews into a chunk's map, valid in the reading thread until that
thread's next read (the reader's contract). So a chunk that leaves the working set is
*retired*: new reads open it afresh, but its map and pin stay until every thread that may still
hold views into it (one in the middle of a read, or one whose transaction on it is still open)
has begun another read, or ended. WorkingSet keeps that account; ChunksOnDemand (demand.py)
does the unmapping.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Held", "Retired", "WorkingSet"]

# Chunks opened again within this many retirements count as retired too early.
_RECENT = 16


class Held(Protocol):
    """What keeps one chunk file on disk (a pin); released once the chunk is unmapped."""

    def release(self) -> None: ...


@dataclass
class Retired:
    """A chunk that left the working set, mapped and pinned until ``waiting`` is empty."""

    number: int
    key: Any  # the ChunkSet's handle on the chunk's LMDB environment
    held: Held
    waiting: weakref.WeakSet[threading.Thread] = field(default_factory=weakref.WeakSet)


@dataclass
class _Thread:
    """One reading thread: how deep inside reads it is, and its transactions (one slot per
    chunk)."""

    in_read: int = 0
    txns: list[Any] | None = None


class WorkingSet:
    """Which chunks of a ChunkSet are open on demand, and when the retired ones may go.

    ``sizes`` are the chunks' sizes in bytes. The chunks kept open fit ``keep_open_bytes``,
    which grows (up to ``max_open_bytes``) each time a chunk retired a moment ago is opened
    again: reads that go round a few chunks at a time (a windowed shuffle) keep them all open,
    reads in chunk order keep few. Thread-safe; never calls back into the set.
    """

    def __init__(
        self, sizes: Sequence[int], keep_open_bytes: int, max_open_bytes: int | None = None
    ) -> None:
        self.sizes = list(sizes)
        self.keep_open_bytes = keep_open_bytes
        self.max_open_bytes = max(keep_open_bytes, max_open_bytes or 0)
        self._recently_retired: deque[int] = deque(maxlen=_RECENT)
        self._lock = threading.Lock()
        self._open: OrderedDict[int, tuple[Any, Held]] = OrderedDict()  # in the order opened
        self._retired: list[Retired] = []
        self._threads: weakref.WeakKeyDictionary[threading.Thread, _Thread] = (
            weakref.WeakKeyDictionary()
        )

    def begin(self, txns: list[Any]) -> tuple[list[int], list[Retired]]:
        """The calling thread starts a read with transaction slots ``txns``: the chunks whose
        transactions it must drop first (retired since its last read; its views into them are
        dead now), and the retired chunks nobody can reach any more (to unmap and unpin)."""
        me = threading.current_thread()
        with self._lock:
            thread = self._threads.get(me)
            if thread is None:
                thread = self._threads[me] = _Thread()
            thread.in_read += 1
            thread.txns = txns
            drop = []
            if thread.in_read == 1:  # (a read inside a read: the outer one's views live on)
                for retired in self._retired:
                    if me in retired.waiting:
                        retired.waiting.discard(me)
                        drop.append(retired.number)
            return drop, self._free()

    def end(self) -> None:
        """The calling thread's read returned (its views stay valid until it begins another)."""
        with self._lock:
            thread = self._threads.get(threading.current_thread())
            if thread is not None:
                thread.in_read = max(thread.in_read - 1, 0)

    def opened(self, number: int, key: Any, held: Held) -> list[int]:
        """Chunk ``number`` was opened (``key``: its environment handle, ``held``: its pin):
        the other chunks to retire now, oldest first, so that the rest fit
        ``keep_open_bytes``. An earlier opening of the same chunk (dropped because its file
        changed) is retired here."""
        with self._lock:
            old = self._open.pop(number, None)
            if old is not None:
                self._retire(number, *old)
            elif number in self._recently_retired:  # too few kept open for these reads
                grown = self.keep_open_bytes + self.sizes[number]
                self.keep_open_bytes = min(grown, self.max_open_bytes)
            self._open[number] = (key, held)
            total = sum(self.sizes[n] for n in self._open)
            out = []
            for n in self._open:
                if total <= self.keep_open_bytes or n == number:
                    break
                total -= self.sizes[n]
                out.append(n)
            return out

    def retire(self, number: int) -> None:
        """Chunk ``number`` leaves the working set; the caller made sure that no new read
        reaches its opening (its environment is no longer handed out)."""
        with self._lock:
            entry = self._open.pop(number, None)
            if entry is not None:
                self._retire(number, *entry)

    def _retire(self, number: int, key: Any, held: Held) -> None:
        self._recently_retired.append(number)
        retired = Retired(number, key, held)
        for t, thread in list(self._threads.items()):
            txns = thread.txns
            busy = thread.in_read > 0 or (txns is not None and txns[number] is not None)
            if busy and t.is_alive():
                retired.waiting.add(t)
        self._retired.append(retired)

    def free(self) -> list[Retired]:
        """The retired chunks nobody can reach any more (threads that ended count as done)."""
        with self._lock:
            return self._free()

    def _free(self) -> list[Retired]:
        done = [r for r in self._retired if not any(t.is_alive() for t in r.waiting)]
        if done:
            self._retired = [r for r in self._retired if r not in done]
        return done

    def everything(self) -> list[tuple[Any, Held]]:
        """Every chunk held, open or retired, as (key, pin), and forget them all (close)."""
        with self._lock:
            out = [*self._open.values(), *((r.key, r.held) for r in self._retired)]
            self._open.clear()
            self._retired = []
            return out

    def forget_after_fork(self) -> None:
        """In a forked child: the pins are the parent's (its copies of their descriptors are
        closed, the parent keeps its locks), the threads are gone."""
        self._lock = threading.Lock()
        for _, held in [*self._open.values(), *((r.key, r.held) for r in self._retired)]:
            held.release()
        self._open = OrderedDict()
        self._retired = []
        self._threads = weakref.WeakKeyDictionary()
