"""What cache_dataset builds, and how: one value handed to whichever runner builds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from yogadl_plus.cache.manifest import Manifest
from yogadl_plus.cache.version_writer import write_version
from yogadl_plus.schema import Schema
from yogadl_plus.sources.base import Source

if TYPE_CHECKING:
    from yogadl_plus.storage.base import Storage

__all__ = ["BuildPlan"]


@dataclass(frozen=True)
class BuildPlan:
    """A build of ``src`` as (``dataset_id``, ``version``) of ``storage``: with ``schema``
    (None: the source's, or inferred from its first records), chunks of about ``chunk_bytes``,
    a progress bar if ``progress``, by ``workers`` processes or, with ``engine="ray"``, Ray
    tasks (a Spark DataFrame: Spark's own tasks)."""

    src: Source
    dataset_id: str
    version: str
    storage: Storage
    schema: Schema | None
    progress: bool
    chunk_bytes: int
    workers: int | None
    engine: str

    @property
    def parallel(self) -> bool:
        """Whether parallel tasks build it (a Spark DataFrame aside)."""
        return self.engine == "ray" or (self.workers or 1) > 1

    def write_serially(self, folder: str) -> Manifest:
        """Build it in this process, reading the source once, in order, into the staging
        ``folder``; the manifest written there."""
        return write_version(
            folder,
            self.src,
            self.dataset_id,
            self.version,
            schema=self.schema,
            progress=self.progress,
            chunk_bytes=self.chunk_bytes,
        )
