"""The order of a stream as a pure function ``(epoch, position) -> index``: no I/O at all.

Resuming, sharding and elastic rescaling are arithmetic instead of replaying an iterator: any
position of any epoch costs the same to compute, in O(1) memory. One module per concept:

- ``permutation``: the one keyed shuffle (a Feistel network, or a Fisher-Yates table when small);
- ``window``: the windowed shuffle (``shuffle_window``), chunks first, then within windows;
- ``settings``: ``OrderSettings``, the order's options as one frozen dataclass;
- ``shards``: the order of one shard (``shard_by`` records or chunks) and its offsets;
- ``interleave``: a mixture's exact shares and their even interleave;
- ``mixing``: which record of which source a mixture's slot reads;
- ``placement``: where a run of positions reads, source by source.
"""

from yogadl_plus.order.mixing import MixOrder
from yogadl_plus.order.permutation import Permutation
from yogadl_plus.order.placement import Placement
from yogadl_plus.order.settings import OrderSettings
from yogadl_plus.order.shards import (
    EpochPositions,
    ShardByChunks,
    ShardByRecords,
    ShardOrder,
    shard_order,
)
from yogadl_plus.order.window import WindowPermutation

__all__ = [
    "EpochPositions",
    "MixOrder",
    "OrderSettings",
    "Permutation",
    "Placement",
    "ShardByChunks",
    "ShardByRecords",
    "ShardOrder",
    "WindowPermutation",
    "shard_order",
]
