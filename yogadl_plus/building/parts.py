"""The part protocol every parallel build follows (a process pool, Ray tasks, Spark tasks): a
task writes one part of the source as chunk files of its own and returns a PartResult naming
them; the driver settles one result per part and publishes.

The driver keeps exactly one result per part, whatever happened to other attempts: a part
whose task died (its process killed) or failed with an ``OSError`` (a dropped connection) runs
again, up to ``ATTEMPTS`` times, and writes files of its own (see storage/sink.py), so no record
is lost or written twice. Other errors (a record that does not fit the schema) fail the build
at once. Nothing is published unless every part is in place.
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from yogadl_plus.building.plan import BuildPlan
from yogadl_plus.cache.manifest import ChunkInfo, Manifest
from yogadl_plus.cache.version_writer import finish_version, source_blocks, write_blocks
from yogadl_plus.errors import TransientStorageError
from yogadl_plus.schema import Schema
from yogadl_plus.sources.base import Source
from yogadl_plus.storage.sink import ChunkSink, part_prefix

__all__ = [
    "ATTEMPTS",
    "RETRIED",
    "PartResult",
    "PartTask",
    "build_parts",
    "write_part",
]

ATTEMPTS = 3
# Errors worth another attempt of a part: a dropped connection, a timeout, a flaky store. Other
# errors (a missing file, a bad record) would fail again: they end the build at once.
RETRIED: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, TransientStorageError)


@dataclass(frozen=True)
class PartTask:
    """Everything a task needs to write one part; sent to the worker as it is."""

    number: int
    source: Source
    schema: Schema
    chunk_bytes: int
    sink: ChunkSink


@dataclass(frozen=True)
class PartResult:
    number: int
    chunks: list[ChunkInfo]
    records: int


def write_part(task: PartTask) -> PartResult:
    """In a worker: write one part's records as chunks and hand them to the sink."""
    prefix = part_prefix(task.number, uuid.uuid4().hex[:8])
    with task.sink.folder() as folder:
        _, blocks = source_blocks(task.source, task.schema)
        chunks = write_blocks(
            folder,
            blocks,
            task.schema,
            task.chunk_bytes,
            first=task.source.offset or 0,
            prefix=prefix,
            on_chunk=functools.partial(task.sink.deliver, folder),
        )
    return PartResult(task.number, chunks, sum(c.records for c in chunks))


def build_parts(
    folder: str,
    plan: BuildPlan,
    schema: Schema,
    distributed: bool,
    run: Callable[[ChunkSink], list[PartResult]],
) -> Manifest:
    """The driver's side of the protocol, for a build into the staging ``folder``: ``run(sink)``
    runs the tasks, which deliver their chunks to ``sink`` (``distributed``: from other
    machines), and returns one result per part, in part order; their chunks are checked in
    place, other attempts' removed, and the manifest written. If anything fails, what the
    tasks delivered goes too (chunks they uploaded into a bucket: now, not at the next build).
    """
    sink = plan.storage.chunk_sink(folder, distributed=distributed)
    try:
        results = run(sink)
        chunks = list(itertools.chain.from_iterable(r.chunks for r in results))
        sink.settle(chunks)
    except BaseException:
        sink.abort()
        raise
    return finish_version(
        folder,
        plan.src,
        schema,
        chunks,
        plan.dataset_id,
        plan.version,
        schema_given=plan.schema is not None,
    )
