"""How what a worker reads reaches the process that consumes it: the one hand-off of the
stream's process workers (processes.py) and of a framework's own workers (the torch face's
DataLoader workers).

In the worker:

- ``start_worker``: what a worker process does to itself as it starts (child.py);
- ``Sender``: has the reader decode its big arrays straight into the worker's ring, and packs
  each result (``pack``: those arrays in the ring, the rest pickled) or the error raised making
  it (``failed``);
- ``read_group``: a framework worker's group of units of a plan, read into items and one Block
  of what reading took, and packed into a ``Parcel`` (the error raised on the item after the
  last one read, if one was, carried in it).

In the consumer:

- ``worker_rings``: a ring per worker, made before the workers start;
- ``unpack``: a result back from its worker's ring;
- ``Parcel.opened``, ``Parcel.raise_error``, ``Parcel.count``: a parcel's items, its error, and
  what reading them took counted in the stream's stats;
- ``Refill``: batches cut from the blocks of passing records a filtered stream's workers hand
  over, as the stream cuts its own.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from yogadl_plus.columns import collate as collated
from yogadl_plus.stream.batching import take
from yogadl_plus.stream.block import Block
from yogadl_plus.stream.stats import add_work
from yogadl_plus.stream.workers.child import ParentWatch, keep_freed_memory, skip_inherited_objects
from yogadl_plus.stream.workers.remote import error_payload, raised_from
from yogadl_plus.stream.workers.ring import Packed, SharedRing

if TYPE_CHECKING:
    from yogadl_plus.cache.fixed import Allocate
    from yogadl_plus.stream.stats import StatsCounter

__all__ = [
    "Parcel",
    "ParentWatch",
    "Refill",
    "Sender",
    "SharedRing",
    "raised_from",
    "read_group",
    "start_worker",
    "unpack",
    "worker_rings",
]


class Decoder(Protocol):
    """What decodes a worker's results: a stream's reader, or its plan."""

    def decode_into(self, allocate: Allocate | None) -> None: ...


class Boundary(Protocol):
    """What a group's reading asks of the boundary's settings (``BoundarySettings``)."""

    @property
    def batch_size(self) -> int | None: ...

    @property
    def filtered(self) -> bool: ...


class Plan(Protocol):
    """What the hand-off asks of a stream's plan (``StreamPlan``: stream/plan.py)."""

    @property
    def boundary(self) -> Boundary: ...

    def read(self, epoch: int, start: int, stop: int) -> Block: ...

    def count_read(self, read: Block, batches: int, seconds: float, waited: bool) -> None: ...


def start_worker(watch: ParentWatch | None) -> None:
    """In a worker process, as it starts: end with the parent (``watch``), leave what it
    inherited out of garbage collection, and keep the memory each result frees for the next."""
    if watch is not None:
        watch.start()
    skip_inherited_objects()
    keep_freed_memory()


def worker_rings(count: int) -> list[SharedRing | None]:
    """A new ring for each of ``count`` workers, read by this process (None where shared memory
    cannot be had: their results are pickled whole)."""
    return [SharedRing.create() for _ in range(count)]


class Sender:
    """A worker's side of the hand-off, over its ``ring`` (the ``index``-th of the consumer's;
    None: results are pickled whole)."""

    def __init__(self, ring: SharedRing | None, index: int = 0) -> None:
        self.ring = ring
        self.index = index

    def decode_into_ring(self, decoder: Decoder) -> None:
        """Have ``decoder`` make big arrays in the ring: ``pack`` then hands them over without
        a copy."""
        if self.ring is not None:
            decoder.decode_into(self.ring.empty)

    def tag(self, work: int) -> None:
        """The parts of the ring taken from now on are ``work``'s (see ``SharedRing.reclaim``)."""
        if self.ring is not None:
            self.ring.tag = work

    def pack(self, result: Any) -> Packed:
        """``result`` pickled, its large buffers in the ring where there is one and room.
        Unpicklable: pickle's own error."""
        if self.ring is None:
            return Packed(pickle.dumps(result, pickle.HIGHEST_PROTOCOL))
        return self.ring.pack(result)

    @staticmethod
    def failed(exc: BaseException) -> bytes:
        """``exc`` as bytes, raised in the consumer by ``raised_from`` as it was."""
        return error_payload(exc)


def unpack(ring: SharedRing | None, packed: Packed) -> Any:
    """The result of a ``Sender.pack`` of the worker whose ring is ``ring``."""
    if not packed.shared:
        return pickle.loads(packed.data)
    assert ring is not None, "a worker without a ring sent a result in one"
    return ring.unpack(packed)


def _nothing_read() -> Block:
    return Block(np.zeros(0, np.int64))


@dataclass
class Parcel:
    """What a framework's worker hands over for one group of units: its items (as they are, or
    ``packed`` in the worker's ring, the ``ring``-th), the error raised on the item after them,
    if one was (``error``), and what reading them took (``read``: the blocks' ends, work and
    bytes). A filtered stream's parcel holds blocks of the passing records as its items."""

    items: list[Any] | None = None
    packed: Packed | None = None
    ring: int = 0
    error: bytes | None = None
    read: Block = dataclasses.field(default_factory=_nothing_read)

    def opened(self, rings: list[SharedRing | None]) -> list[Any]:
        """The items, out of their worker's ring if they came in one (``rings``: the
        workers')."""
        if self.packed is not None:
            items: list[Any] = unpack(rings[self.ring], self.packed)
            return items
        assert self.items is not None
        return self.items

    def raise_error(self, where: Callable[[], str]) -> None:
        """The error the worker raised after the items, if it raised one; ``where()`` names the
        item it failed on, where the error itself cannot be sent back."""
        if self.error is not None:
            raise raised_from(self.error, where)

    def count(self, plan: Plan, batches: int, seconds: float, waited: bool) -> None:
        """Count the parcel's records in ``plan``'s stats, handed out in ``batches``, and the
        ``seconds`` the consumer spent getting them (waiting for a worker when ``waited``)."""
        plan.count_read(self.read, batches, seconds, waited)


def read_group(
    plan: Plan,
    epoch: int,
    start: int,
    stop: int,
    unit: int,
    collate: Callable[[Any], Any] | None,
    sender: Sender | None,
) -> Parcel:
    """The items of ``plan``'s positions [start, stop) of ``epoch``, one per ``unit`` positions
    (records, or batches as the stream makes them), each through ``collate`` when there is
    one; a filtered stream's are the blocks of the records that pass.

    With a ``sender`` (in a worker), an error is carried back in the parcel after the items
    read before it, and the items are packed in the sender's ring if it has one; without a
    sender (in the consumer) it is raised.
    """
    items: list[Any] = []
    read = _nothing_read()
    try:
        _read_into(plan, epoch, (start, stop, unit), collate, items, read)
    except Exception as exc:
        if sender is None:
            raise
        return Parcel(items, error=sender.failed(exc), read=read)
    if sender is None or sender.ring is None:
        return Parcel(items, read=read)  # (sent as the framework sends them)
    return Parcel(packed=sender.pack(items), ring=sender.index, read=read)


def _read_into(
    plan: Plan,
    epoch: int,
    span: tuple[int, int, int],
    collate: Callable[[Any], Any] | None,
    out: list[Any],
    read: Block,
) -> None:
    """Read the items of ``span`` (start, stop, unit) into ``out``, adding the work of the
    blocks to ``read``."""
    start, stop, unit = span

    def block_of(first: int, end: int) -> Block:
        block = plan.read(epoch, first, end)
        read.ends = np.concatenate([read.ends, block.ends])
        add_work(read.work, block.work)
        read.nbytes += block.nbytes
        return block

    def item_of(block: Block) -> Any:
        if plan.boundary.batch_size is None:
            item = block.items[0]  # type: ignore[index]
        elif block.columns is not None:
            item = block.columns
        else:
            item = collated(block.items) if block.items else {}
        return item if collate is None else collate(item)

    boundary = plan.boundary
    if boundary.filtered:
        # Blocks of the passing records: which make a batch depends on what passes before.
        try:
            out.append(_bare(block_of(start, stop)))
        except Exception:  # read those before the record that fails, one by one
            for position in range(start, stop):
                out.append(_bare(block_of(position, position + 1)))
        return
    if boundary.batch_size is None:
        try:
            records = block_of(start, stop).items
        except Exception:
            records = None
        if records is None:  # find the record that fails, the ones before it read
            for position in range(start, stop):
                out.append(item_of(block_of(position, position + 1)))
            return
        out.extend(records if collate is None else map(collate, records))
        return
    for first in range(start, stop, unit):
        out.append(item_of(block_of(first, min(first + unit, stop))))


def _bare(block: Block) -> Block:
    """``block``'s records and their ends, to hand over (its work is counted apart)."""
    return Block(block.ends, items=block.items, columns=block.columns)


class Refill:
    """Batches of ``size`` records cut from blocks of records as they come, across block
    boundaries (``stream.batching.take``, which the stream cuts its own batches with)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pending: list[Block] = []
        self.count = 0  # records pending

    def add(self, blocks: list[Block]) -> int:
        """Take ``blocks`` in; how many full batches are pending now."""
        for block in blocks:
            if len(block):
                self.pending.append(block)
                self.count += len(block)
        return self.count // self.size

    def batch(self, stats: StatsCounter, n: int | None = None) -> tuple[Any, int]:
        """The next batch (of ``n`` records, a full one by default) and the position after its
        last record; the time cutting it took goes to ``stats``."""
        n = self.size if n is None else n
        began = perf_counter()
        batch, end, self.pending = take(self.pending, n)
        stats.add_batching(perf_counter() - began)
        self.count -= n
        return batch, end
