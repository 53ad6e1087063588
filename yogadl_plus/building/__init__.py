"""Building caches: read a source once and publish it as a version of a storage.

The modules, each importing only those before it in this list:

- ``plan``: BuildPlan, what cache_dataset builds and how, handed to the runner;
- ``parts``: the part protocol of parallel builds (PartTask, PartResult, write_part, retries,
  and build_parts, the driver's side);
- ``pool``: parts on a process pool or as Ray tasks; ``spark``: parts as Spark tasks;
- ``front``: ``cache_dataset``, which picks one of them or the serial build.

The write primitives and the serial build, ``write_version``, belong to the cache format's
writing side (cache/version_writer.py), below storage: ``Storage.cacheable`` writes with it.
"""

from __future__ import annotations

from yogadl_plus.building.front import ENGINES, cache_dataset

__all__ = ["ENGINES", "cache_dataset"]
