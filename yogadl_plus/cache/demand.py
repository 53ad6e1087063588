"""Reading a version whose chunk files come to local disk only when a read needs them.

A ChunkSet reading on demand asks a ChunkSource (a bucket's version, see storage/ondemand.py)
for each chunk it opens: the source puts the file in place, checked, and pins it so that nobody
deletes it while it is mapped. The set keeps a bounded working set of chunks open
(``keep_open_bytes``) and lets go of the others, so that a version bigger than the disk can
be read through a cache of bounded size.

Letting go of a chunk is the delicate part: a read hands out memoryviews into the chunk's
map, valid in the reading thread until that thread's next read (the reader's contract). So a
chunk that leaves the working set is *retired*: new reads open it afresh, but its map and pin
stay until every thread that may still hold views into it has begun another read, or ended.
WorkingSet (workingset.py) keeps that account; ChunksOnDemand, the ChunkSet's strategy for
opening chunks on demand, does the fetching, opening and unmapping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import lmdb

from yogadl_plus.cache.opening import OpenChunks
from yogadl_plus.cache.workingset import Held, Retired, WorkingSet

__all__ = ["ChunkSource", "ChunksOnDemand", "Held"]


class ChunkSource(Protocol):
    """Where the chunks of a version read on demand come from."""

    #: How many bytes of chunks a reader keeps open beyond those its reads need at the moment,
    #: at first, and at most (it keeps more open while it keeps opening chunks again).
    keep_open_bytes: int
    max_open_bytes: int

    def acquire(self, number: int) -> Held:
        """Chunk ``number``'s file in place (fetched and checked against the manifest if it
        was not) and pinned until the returned pin is released; StorageError or
        CacheCorrupted naming the chunk otherwise."""
        ...

    def read_ahead(self, numbers: Sequence[int]) -> None:
        """Chunks that reads will need soon, soonest first: fetched in the background."""
        ...

    def close(self) -> None:
        """Let go of what was fetched ahead and not opened yet."""
        ...


class ChunksOnDemand:
    """How a ChunkSet reading on demand opens chunks and lets go of them: each chunk is fetched
    and pinned through ``source`` before ``opened`` opens (and checks) it, the chunks beyond
    the working set are retired, and retired chunks nobody can reach any more are unmapped and
    unpinned."""

    def __init__(self, opened: OpenChunks, source: ChunkSource) -> None:
        self.opened = opened
        self.source = source
        self.working = WorkingSet(
            [c.bytes for c in opened.chunks], source.keep_open_bytes, source.max_open_bytes
        )

    def env(self, number: int) -> lmdb.Environment:
        """Chunk ``number``'s environment: fetched and pinned first if it is not open (outside
        the lock, so that other threads open other chunks meanwhile), then opened and checked
        as every chunk is; chunks beyond the working set are retired."""
        opened = self.opened
        env = opened.envs[number]
        if env is not None:
            return env
        held = self.source.acquire(number)
        with opened.lock:
            env = opened.envs[number]
            if env is not None:  # another thread opened it meanwhile
                held.release()
                return env
            try:
                key, env = opened.open(number)
            except BaseException:
                held.release()
                raise
            for old in self.working.opened(number, key, held):
                # No read reaches this opening any more; it goes once no thread can hold
                # views into it.
                opened.retire(old)
                self.working.retire(old)
            self._unmap(self.working.free())
        return env

    def read_begins(self, txns: list[Any], end_transaction: Callable[[int], None]) -> None:
        """The calling thread, with transaction slots ``txns``, starts a read. Its views of
        earlier reads are dead now (they are valid until the thread's next read), so its
        transactions on retired chunks go (``end_transaction(number)``), and chunks nobody can
        reach any more are unmapped and unpinned."""
        drop, free = self.working.begin(txns)
        for number in drop:
            end_transaction(number)
        if free:
            with self.opened.lock:
                self._unmap(free)

    def read_ends(self) -> None:
        """The calling thread's read returned (its views stay valid until its next read)."""
        self.working.end()

    def read_ahead(self, numbers: Sequence[int]) -> None:
        """Chunks that reads will need soon, soonest first: those not open are fetched in the
        background."""
        envs = self.opened.envs
        self.source.read_ahead([n for n in numbers if 0 <= n < len(envs) and envs[n] is None])

    def _unmap(self, retired: list[Retired]) -> None:
        """Close retired chunks' environments and drop their pins. Under the opened lock."""
        for chunk in retired:
            self.opened.release(chunk.key)
            chunk.held.release()

    def close(self) -> None:
        """The pins of every chunk held, open or retired, and what was fetched ahead, go."""
        for _, held in self.working.everything():
            held.release()
        self.source.close()

    def forget_after_fork(self) -> None:
        """In a forked child: the pins and threads are the parent's."""
        self.working.forget_after_fork()
