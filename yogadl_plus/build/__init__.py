"""Building caches: read a source once and publish it as a version of a storage.

The modules, each knowing only the ones above it in this list:

- ``records``: the write primitives (the schema to write with, records into checked chunk
  files, the manifest, the progress bar) and the serial build;
- ``parts``: the part protocol of parallel builds (PartTask, PartResult, write_part, retries);
- ``pool``: parts on a process pool or Ray tasks; ``spark``: parts as Spark tasks;
- ``front``: ``cache_dataset``, which picks one of them.
"""

from __future__ import annotations

from yogadl_plus.build.front import ENGINES, cache_dataset

__all__ = ["ENGINES", "cache_dataset"]
