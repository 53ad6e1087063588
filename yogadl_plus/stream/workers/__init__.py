"""Workers that read a stream's units ahead of it, in order: threads, processes or Ray actors.

- ``base``: the task they run and what every kind of worker provides;
- ``pool``: ``OrderedPool``, which runs them and hands results back in order;
- ``threads``, ``processes``, ``rayactors``: the kinds (``worker_type``);
- ``child``: what a worker process does to itself as it starts;
- ``remote``: errors raised in a worker process, sent back whole;
- ``ring``: shared memory that hands a worker's big results over without a copy.
"""

from yogadl_plus.stream.workers.base import GRACE_SECONDS, Task
from yogadl_plus.stream.workers.pool import KINDS, OrderedPool

__all__ = ["GRACE_SECONDS", "KINDS", "OrderedPool", "Task"]
