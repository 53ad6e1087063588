"""The sequential layer: a stream over any RecordSource, one code path for all.

- ``stream``: ``Stream``, which hands out one shard's epochs and keeps where it is;
- ``plan``: ``StreamPlan``, what it reads at each (epoch, position): the faces' one seam;
- ``settings``: ``BoundarySettings`` and ``WorkerSettings`` (with order/'s ``OrderSettings``);
- ``units``: an epoch cut into units of work, announced ahead;
- ``reader``: the boundary's work on a unit (predicate, decode, transform), per source leaf;
- ``ngram_reader``: n-gram windows read from a DataRef, and the anchors each DataRef has;
- ``block``, ``batching``: what a unit gives, and batches cut from blocks;
- ``ledger``: where each item handed out ends, for ``offset_after``;
- ``state``: ``StreamState``, a checkpoint's position, checked when loaded;
- ``stats``: where the time goes;
- ``workers/``: threads and processes that read ahead, in order.
"""

from yogadl_plus.stream.plan import StreamPlan
from yogadl_plus.stream.settings import BoundarySettings, WorkerSettings
from yogadl_plus.stream.state import StreamState
from yogadl_plus.stream.stats import StreamStats
from yogadl_plus.stream.stream import Stream

__all__ = [
    "BoundarySettings",
    "Stream",
    "StreamPlan",
    "StreamState",
    "StreamStats",
    "WorkerSettings",
]
