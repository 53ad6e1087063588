"""Building caches: read a source once and publish it as a version of a storage.

The modules, each importing only those before it in this list:

- ``records``: the write primitives (the schema to write with, records into checked chunk
  files, the manifest, the progress bar) and the serial build, ``build_version``;
- ``parts``: the part protocol of parallel builds (PartTask, PartResult, write_part, retries);
- ``pool``: parts on a process pool or as Ray tasks; ``spark``: parts as Spark tasks;
- ``front``: ``cache_dataset``, which picks one of them.

Storage sits below the build and never imports it, so ``Storage.cacheable`` gets its builder
from here, at import: the serial build, ``build_version``, with its defaults.
"""

from __future__ import annotations

from yogadl_plus.build.front import ENGINES, cache_dataset
from yogadl_plus.build.records import build_version
from yogadl_plus.storage.base import set_source_builder

__all__ = ["ENGINES", "cache_dataset"]

set_source_builder(build_version)
