"""OrderSettings: how a stream orders its records, as one frozen dataclass checked once."""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass

from yogadl_plus.checks import check_bool, check_int

__all__ = ["CHUNK_SHARDS_TAKE_NO_GLOBAL_ORDER", "SHARD_BY", "OrderSettings"]

CHUNK_SHARDS_TAKE_NO_GLOBAL_ORDER = (
    "shard_by='chunks' shards whole chunks of records: it takes neither ngram= nor "
    "global_start= (use shard_by='records' for those)"
)
SHARD_BY = ("records", "chunks")


@dataclass(frozen=True)
class OrderSettings:
    """How a stream orders its records: shuffle, shards, and where it starts; checked once, here.

    Each field is the ``stream(...)`` keyword of the same name. ``shuffle_seed`` may be None
    with ``shuffle=True`` on one shard (the stream draws one: ``seeded``); ``start_offset``
    counts this shard's positions from the first epoch, ``global_start`` is the elastic resume
    point (``shard_by="records"`` only). See docs/streams.md.

    ``shuffle_window=W`` (with ``shuffle=True`` only) makes each epoch a ``WindowPermutation``
    of the positions grouped by chunk instead of a full ``Permutation``: see
    docs/windowed-shuffle.md. It holds with every other setting: with
    ``skip_shuffle_at_epoch_end`` every epoch reuses epoch 0's windowed order; with
    ``shard_by="chunks"`` each shard shuffles its own chunks in windows of W of them; with
    n-grams the positions (anchors) are grouped by the chunk of their anchor record.

    Shards differ by one position by default (every record exactly once per epoch); they are
    made equal by ``drop_shard_remainder`` (the last positions of the epoch's order are left
    out) or ``pad_shard_remainder`` (the order wraps around to its first positions, which some
    shards then hand out twice in that epoch, as torch's DistributedSampler pads).
    """

    shuffle: bool = False
    shuffle_seed: int | None = None
    skip_shuffle_at_epoch_end: bool = False
    shard_rank: int = 0
    num_shards: int = 1
    drop_shard_remainder: bool = False
    pad_shard_remainder: bool = False
    shard_by: str = "records"
    start_offset: int = 0
    global_start: int | None = None
    shuffle_window: int | None = None

    def __post_init__(self) -> None:
        def keep(name: str, value: object) -> None:
            object.__setattr__(self, name, value)  # normalized (np.int64 -> int): frozen

        keep("start_offset", check_int("start_offset", self.start_offset, 0))
        if self.global_start is not None:
            keep("global_start", check_int("global_start", self.global_start, 0))
        keep("shuffle", check_bool("shuffle", self.shuffle))
        keep(
            "skip_shuffle_at_epoch_end",
            check_bool("skip_shuffle_at_epoch_end", self.skip_shuffle_at_epoch_end),
        )
        keep("drop_shard_remainder", check_bool("drop_shard_remainder", self.drop_shard_remainder))
        keep("pad_shard_remainder", check_bool("pad_shard_remainder", self.pad_shard_remainder))
        if self.drop_shard_remainder and self.pad_shard_remainder:
            raise ValueError(
                "drop_shard_remainder=True and pad_shard_remainder=True: shards are evened "
                "either by dropping the last positions or by repeating the first ones; pass one"
            )
        keep("num_shards", check_int("num_shards", self.num_shards, 1))
        keep("shard_rank", check_int("shard_rank", self.shard_rank, 0, self.num_shards - 1))
        if self.shuffle_seed is not None:
            keep("shuffle_seed", check_int("shuffle_seed", self.shuffle_seed, 0))
        elif self.shuffle and self.num_shards != 1:
            raise ValueError(
                "shuffle=True with num_shards > 1 needs an explicit shuffle_seed, shared by "
                "all ranks; otherwise each rank would draw its own and the shards would overlap"
            )
        if self.shard_by not in SHARD_BY:
            raise ValueError(f"shard_by must be 'records' or 'chunks', got {self.shard_by!r}")
        if self.shard_by == "chunks" and self.global_start is not None:
            raise ValueError(CHUNK_SHARDS_TAKE_NO_GLOBAL_ORDER)
        if self.shuffle_window is not None:
            keep("shuffle_window", check_int("shuffle_window", self.shuffle_window, 1))
            if not self.shuffle:
                raise ValueError(
                    f"shuffle_window={self.shuffle_window} shuffles within windows of chunks: "
                    "it needs shuffle=True (or leave shuffle_window=None)"
                )

    def seeded(self) -> OrderSettings:
        """These settings, with a freshly drawn seed if they shuffle without one."""
        if self.shuffle and self.shuffle_seed is None:
            return dataclasses.replace(self, shuffle_seed=secrets.randbits(63))
        return self
