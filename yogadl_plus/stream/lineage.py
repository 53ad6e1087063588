"""Lineage: which records the next items of a stream are made of, computed, not read.

The order is arithmetic, so the records at any run of positions are known without reading
them: a record's index, a batch's in order, an n-gram window's, or for a mixture (source name,
index) pairs. Only where positions may hand out nothing is anything read: a skip list is a
binary search, a predicate reads (and decodes) just the fields it names, as the stream does.
Nothing is handed out and the stream does not move, so a fresh stream that loaded a saved
state answers "which records made step N" with no training.

Items run on across epochs, as a stream's iterations do, and epochs that hand out nothing are
passed over: the rest of an epoch that a skip list, a predicate or ``drop_last`` leaves empty,
or a shard with no positions in an epoch. Where no later epoch can hand out an item (the
shard has no positions, fewer than a batch with ``drop_last``, or no record of the source
passes the skip list and predicate), the items that exist are the answer. Where later epochs
may differ (shuffled shards hold other records each epoch) and many whole epochs in a row hand
out nothing, the search stops with a ValueError saying how many items it found: never a wrong
answer, never a loop without end.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from yogadl_plus.order.placement import Placement
    from yogadl_plus.stream.plan import StreamPlan

__all__ = ["lineage", "position_after_items", "skip_items"]

# Positions placed at once (the order costs per call, not per position).
_STEP = 8192
# Whole epochs in a row that hand out nothing, in passes over the source's positions, after
# which a search for items stops (when one epoch might still differ from the next): a shard
# of S holds about 1/S of the positions, so this is about 8 S epochs.
_SEARCH_PASSES = 8


def lineage(plan: StreamPlan, epoch: int, position: int, n: int) -> list[Any]:
    """The next ``n`` items of ``plan``'s stream from (``epoch``, ``position``), each as the
    records it is made of: an int64 array (one index for a record, the batch's in order, a
    window's, or for batches of windows one row per window), or for a mixture a list of
    (source name, index) pairs. Fewer than ``n`` only where no later epoch can hand out an
    item; a ValueError where it cannot tell (see the module)."""
    items: list[Any] = []
    search = _Search(plan, f"{n} items")
    while len(items) < n:
        before = len(items)
        _add_epoch_items(plan, epoch, position, n, items)
        if len(items) == n or not search.goes_on(epoch, position, len(items) > before, len(items)):
            break
        epoch, position = epoch + 1, 0
    return items


def skip_items(plan: StreamPlan, epoch: int, position: int, items: int) -> tuple[int, int]:
    """Where the iteration from (``epoch``, ``position``) goes on after its first ``items``
    items, across epochs: the (epoch, position) whose ``lineage`` is the items after them.
    Arithmetic without a skip list or predicate (whole epochs are jumped); with them, their
    fields are read, as ``lineage`` reads them, but no item is made. Past the last item there
    is (see the module), the epoch after it."""
    search = _Search(plan, f"the first {items} items")
    passed = 0
    while items:
        there = _items_left(plan, epoch, position)
        if items < there:
            return epoch, position_after_items(plan, epoch, position, items)
        items -= there
        passed += there
        if not search.goes_on(epoch, position, there > 0, passed):
            return epoch + 1, 0
        epoch, position = epoch + 1, 0
        if not plan.boundary.filtered:  # every later epoch is whole: jump over them
            whole, items = divmod(items, plan.items_per_epoch)
            epoch += whole
    return epoch, position


def position_after_items(plan: StreamPlan, epoch: int, position: int, items: int) -> int:
    """The position right after the first ``items`` items of an iteration of ``epoch`` begun
    at ``position`` (the epoch's length past its last item): arithmetic, unless positions may
    hand out nothing (then a predicate's fields are read, as ``lineage`` reads them). What a
    rank restarted alone computes its resume point from: it needs nothing of its peers."""
    size = plan.boundary.batch_size or 1
    length = plan.epoch_length(epoch)
    need = items * size
    if not plan.boundary.filtered:
        return min(position + need, length)
    while need and position < length:
        stop = min(position + _STEP, length)
        kept = _kept_mask(plan, plan.units.placed(epoch, position, stop))
        offsets = np.flatnonzero(kept) if kept is not None else np.arange(stop - position)
        if need <= len(offsets):
            return position + int(offsets[need - 1]) + 1
        need -= len(offsets)
        position = stop
    return position if not need else length


class _Search:
    """Whether the epochs after one that fell short of the items asked for may still hand
    some out (every later epoch is whole: ``positions_per_epoch`` positions); see the
    module. ``asked`` names what was asked for, in an error."""

    def __init__(self, plan: StreamPlan, asked: str) -> None:
        self.plan = plan
        self.asked = asked
        self.first_empty = 0  # the run of whole epochs that handed out nothing, up to now
        self.empty = 0
        self.keeps_any: bool | None = None  # whether any record passes: read when needed

    def goes_on(self, epoch: int, position: int, handed: bool, found: int) -> bool:
        """After the iteration of ``epoch`` from ``position``, which ``handed`` out items or
        not (``found`` so far): whether a later epoch may hand out one."""
        plan = self.plan
        if plan.items_per_epoch == 0:
            return False  # no positions, or fewer than a batch with drop_last (a bound: 0 is 0)
        if not plan.boundary.filtered:
            return True  # every whole epoch hands out items_per_epoch items
        whole = position == 0 and plan.epoch_length(epoch) == plan.positions_per_epoch
        if handed or not whole:
            self.empty = 0
            return True
        self.first_empty = epoch if not self.empty else self.first_empty
        self.empty += 1
        if self.keeps_any is None:
            self.keeps_any = _keeps_any(plan)
        if not self.keeps_any:
            return False  # no record of the source is ever handed out
        if self.empty >= math.ceil(_SEARCH_PASSES * plan.num_positions / plan.positions_per_epoch):
            boundary = plan.boundary
            left = "fewer records than a batch" if boundary.drop_last else "no record"
            raise ValueError(
                f"lineage found {found} of {self.asked}: epochs {self.first_empty} to {epoch} "
                f"of this shard hand out nothing (the skip list or predicate leaves {left} in "
                "each of them) and a later epoch may or may not: ask for fewer, or from a "
                f"start_offset past them ({plan.offset_of(epoch + 1, 0)})"
            )
        return True


def _add_epoch_items(plan: StreamPlan, epoch: int, position: int, n: int, items: list[Any]) -> None:
    """Append to ``items`` those the iteration of ``epoch`` from ``position`` hands out, until
    there are ``n``."""
    size = plan.boundary.batch_size or 1
    length = plan.epoch_length(epoch)
    # What the epoch's batch being filled holds so far: (leaf, index) arrays.
    held: list[tuple[np.ndarray, np.ndarray]] = []
    count = 0
    while position < length and len(items) < n:
        stop = min(position + _STEP, length)
        leaves, indices = _kept(plan, plan.units.placed(epoch, position, stop))
        position = stop
        at = 0
        while at < len(indices) and len(items) < n:
            take = min(size - count, len(indices) - at)
            held.append((leaves[at : at + take], indices[at : at + take]))
            count += take
            at += take
            if count == size:
                items.append(_item(plan, held))
                held, count = [], 0
    if count and len(items) < n and not plan.boundary.drop_last:
        items.append(_item(plan, held))  # the epoch's last, short batch


def _items_left(plan: StreamPlan, epoch: int, position: int) -> int:
    """Items the iteration of ``epoch`` hands out from ``position`` on."""
    if not plan.boundary.filtered:
        return plan.items_from(epoch, position)
    length = plan.epoch_length(epoch)
    kept = 0
    for start in range(position, length, _STEP):
        mask = _kept_mask(plan, plan.units.placed(epoch, start, min(start + _STEP, length)))
        assert mask is not None  # (filtered)
        kept += int(np.count_nonzero(mask))
    return plan.items_in(kept)


def _keeps_any(plan: StreamPlan) -> bool:
    """Whether any record of the source passes the skip list and predicate: the predicate's
    fields of every record are read, until one passes."""
    for reader in plan.reader.readers:
        size = len(reader.dataref)
        for start in range(0, size, _STEP):
            keep, _ = reader.kept_values(np.arange(start, min(start + _STEP, size)))
            if keep is None or len(keep):
                return True
    return False


def _kept(plan: StreamPlan, placement: Placement) -> tuple[np.ndarray, np.ndarray]:
    """What the positions of ``placement`` that hand out an item read, in position order:
    the leaf (its number) and the record (or window) index of each."""
    n = len(placement)
    leaves = np.zeros(n, np.int64)
    indices = np.zeros(n, np.int64)
    for leaf, where, records in placement.parts:
        offsets = placement.offsets((leaf, where, records))
        leaves[offsets] = leaf
        indices[offsets] = records
    kept = _kept_mask(plan, placement)
    if kept is None:
        return leaves, indices
    return leaves[kept], indices[kept]


def _kept_mask(plan: StreamPlan, placement: Placement) -> np.ndarray | None:
    """Which positions of ``placement`` hand out an item (None: all of them)."""
    if not plan.boundary.filtered:
        return None
    kept = np.ones(len(placement), bool)
    for leaf, where, records in placement.parts:
        keep, _ = plan.reader.readers[leaf].kept_values(records)
        if keep is not None:
            left = np.ones(len(records), bool)
            left[keep] = False
            kept[placement.offsets((leaf, where, records))[left]] = False
    return kept


def _item(plan: StreamPlan, held: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    """One item's records, from its positions' (leaf, index) arrays."""
    readers = plan.reader.readers
    leaves = np.concatenate([a for a, _ in held]) if len(held) > 1 else held[0][0]
    indices = np.concatenate([b for _, b in held]) if len(held) > 1 else held[0][1]
    batching = plan.boundary.batch_size is not None
    if readers[0].name:  # a mixture's leaves have names: (source name, record) pairs
        return [(readers[leaf].name, readers[leaf].record(i)) for leaf, i in zip(leaves, indices)]
    ngram = plan.boundary.ngram
    if ngram is None:
        return indices.astype(np.int64, copy=True)
    anchors = readers[0].anchors
    assert anchors is not None
    windows = ngram.window_records(anchors[indices])
    return windows if batching else windows[0]
