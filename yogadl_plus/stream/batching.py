"""Batches cut from a run of blocks: the first ``n`` items, across block boundaries, or the
whole batches of one block, as views of it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from yogadl_plus.columns import collate
from yogadl_plus.stream.block import Block, sliced_columns

__all__ = ["take", "whole_batches"]


def take(blocks: list[Block], n: int) -> tuple[Any, int, list[Block]]:
    """The first ``n`` items of ``blocks`` as one batch, the position after the last of them,
    and the blocks left over."""
    taken: list[Block] = []
    left = n
    rest = list(blocks)
    while left:
        block = rest.pop(0)
        if len(block) <= left:
            taken.append(block)
            left -= len(block)
        else:
            taken.append(block.sliced(0, left))
            rest.insert(0, block.sliced(left, len(block)))
            left = 0
    end = int(taken[-1].ends[-1])
    if taken[0].columns is not None:
        columns = [b.columns for b in taken if len(b) and b.columns is not None]
        return _concat(columns) if len(columns) > 1 else columns[0], end, rest
    items = [item for b in taken for item in (b.items or [])]
    return collate(items), end, rest


def whole_batches(block: Block, size: int) -> Iterator[tuple[int, dict[Any, Any]]]:
    """The whole batches of ``size`` at the start of ``block`` (of columns), each as the position
    after its last item and its columns (views of the block's)."""
    columns, ends = block.columns, block.ends
    assert columns is not None
    if len(block) == size:  # (a unit of one batch: as it came)
        yield int(ends[-1]), columns
        return
    for first in range(0, len(block) - len(block) % size, size):
        stop = first + size
        yield int(ends[stop - 1]), sliced_columns(columns, first, stop)


def _concat(parts: list[dict[Any, Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, first in parts[0].items():
        values = [p[key] for p in parts]
        if isinstance(first, dict):
            out[key] = _concat(values)
        elif isinstance(first, np.ndarray):
            out[key] = np.concatenate(values)
        else:
            out[key] = [v for part in values for v in part]
    return out
