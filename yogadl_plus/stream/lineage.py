"""Lineage: which records the next items of a stream are made of, computed, not read.

The order is arithmetic, so the records at any run of positions are known without reading
them: a record's index, a batch's in order, an n-gram window's, or for a mixture (source name,
index) pairs. Only where positions may hand out nothing is anything read: a skip list is a
binary search, a predicate reads (and decodes) just the fields it names, as the stream does.
Nothing is handed out and the stream does not move, so a fresh stream that loaded a saved
state answers "which records made step N" with no training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from yogadl_plus.order.placement import Placement
    from yogadl_plus.stream.plan import StreamPlan

__all__ = ["lineage", "position_after_items"]

# Positions placed at once (the order costs per call, not per position).
_STEP = 8192


def lineage(plan: StreamPlan, epoch: int, position: int, n: int) -> list[Any]:
    """The next ``n`` items of ``plan``'s stream from (``epoch``, ``position``), each as the
    records it is made of: an int64 array (one index for a record, the batch's in order, a
    window's, or for batches of windows one row per window), or for a mixture a list of
    (source name, index) pairs. Fewer than ``n`` when an epoch hands out nothing (a predicate
    that keeps no record: the stream's every epoch is then empty)."""
    size = plan.boundary.batch_size or 1
    items: list[Any] = []
    while len(items) < n:
        length = plan.epoch_length(epoch)
        before, examined = len(items), position < length
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
        short = count and len(items) < n and not plan.boundary.drop_last
        if short and plan.boundary.batch_size is not None:
            items.append(_item(plan, held))  # the epoch's last, short batch
        if examined and len(items) == before:
            break  # an epoch that hands out nothing: so will every later one
        epoch, position = epoch + 1, 0
    return items


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
