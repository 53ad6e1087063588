"""Block: what reading one unit of a stream's positions gives, and its items as records."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from yogadl_plus.columns import records
from yogadl_plus.stream.stats import Work, new_work

__all__ = ["Block", "as_items", "sliced_columns"]


@dataclass
class Block:
    """What one unit of positions gives: per item, the position after it (``ends``), and the
    items themselves, as a list or (records and batches without a transform) as columns; with
    the seconds reading it took (``work``, by kind: stats.WORK) and the bytes it decoded."""

    ends: np.ndarray
    items: list[Any] | None = None
    columns: dict[Any, Any] | None = None
    work: Work = dataclasses.field(default_factory=new_work)
    nbytes: int = 0

    def __len__(self) -> int:
        return len(self.ends)

    def sliced(self, start: int, stop: int) -> Block:
        """Its items ``[start, stop)`` (views of its arrays), without work or bytes."""
        if self.columns is not None:
            return Block(self.ends[start:stop], columns=sliced_columns(self.columns, start, stop))
        assert self.items is not None
        return Block(self.ends[start:stop], items=self.items[start:stop])


def sliced_columns(columns: dict[Any, Any], start: int, stop: int) -> dict[Any, Any]:
    """Items ``[start, stop)`` of ``columns`` (nested dicts of arrays or lists): views."""
    return {
        k: sliced_columns(v, start, stop) if isinstance(v, dict) else v[start:stop]
        for k, v in columns.items()
    }


def as_items(block: Block) -> Block:
    """A block of records as a list of record dicts (a reader may give them as columns)."""
    if block.columns is None:
        return block
    items = records(block.columns, len(block))
    return Block(block.ends, items=items, work=block.work, nbytes=block.nbytes)
