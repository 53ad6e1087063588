"""Where the tasks of a parallel build put their chunk files.

A task writes its part's chunks into a folder on its own machine and hands them to the sink,
which makes them part of the build: a folder sink's folder *is* the build's staging folder (on a
filesystem every worker sees); an upload sink sends them into the build's folder in a bucket.
Both are picklable, so they travel to pool processes and Ray tasks. File names carry the part
and a random attempt id, so a retried task never overwrites or duplicates another attempt's
chunks; ``settle`` keeps only the chunks the manifest will name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

from yogadl_plus.cache.integrity import STAMP_SUFFIX
from yogadl_plus.cache.manifest import ChunkInfo
from yogadl_plus.cache.version_writer import mark_build
from yogadl_plus.errors import CacheCorrupted
from yogadl_plus.storage.objects import ObjectStore

__all__ = ["ChunkSink", "FolderSink", "UploadSink", "part_prefix"]

_PART_FILE = re.compile(r"p\d{5,}-[0-9a-f]{8}-chunk-\d{5,}\.mdb")


def part_prefix(part: int, attempt: str) -> str:
    """The start of the chunk file names that attempt ``attempt`` of part ``part`` writes."""
    return f"p{part:05d}-{attempt}-"


class ChunkSink(ABC):
    """The destination of the chunks that build tasks write."""

    @abstractmethod
    def folder(self) -> contextlib.AbstractContextManager[str]:
        """A folder on this machine for a task to write its chunk files into."""

    @abstractmethod
    def deliver(self, folder: str, chunk: ChunkInfo) -> ChunkInfo:
        """Make a chunk just written in ``folder`` part of the build (while the task writes
        the next); returns it as the manifest will name it."""

    @abstractmethod
    def settle(self, chunks: Sequence[ChunkInfo]) -> None:
        """Before publishing: check every chunk in ``chunks`` is in place (CacheCorrupted if
        not) and remove the chunk files of failed attempts."""

    def abort(self) -> None:  # noqa: B027 (most sinks have nothing to undo)
        """The build failed: remove what tasks delivered that the storage would not remove
        with its staging folder (best effort)."""


class FolderSink(ChunkSink):
    """Tasks write straight into the build's staging folder (shared by every worker)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def folder(self) -> contextlib.AbstractContextManager[str]:
        return contextlib.nullcontext(self.path)

    def deliver(self, folder: str, chunk: ChunkInfo) -> ChunkInfo:
        return chunk

    def settle(self, chunks: Sequence[ChunkInfo]) -> None:
        named = {c.file: c for c in chunks}
        for info in chunks:
            path = os.path.join(self.path, info.file)
            size = os.path.getsize(path) if os.path.isfile(path) else None
            if size != info.bytes:
                found = "it is not there" if size is None else f"it has {size} bytes"
                raise CacheCorrupted(
                    f"{path}: a build task reported this chunk of {info.bytes} bytes, but {found}"
                )
        for entry in os.listdir(self.path):
            if _PART_FILE.fullmatch(entry) and entry not in named:
                os.remove(os.path.join(self.path, entry))
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.path, entry + STAMP_SUFFIX))


class UploadSink(ChunkSink):
    """Tasks upload their chunks into ``<base><build>/`` of an object store, from wherever they
    run; the storage publishes the manifest naming them. ``build_id``: the id the build's chunks
    record (cache/version_writer.py; None: each task's folder makes one of its own)."""

    def __init__(
        self, objects: ObjectStore, base: str, build: str, build_id: str | None = None
    ) -> None:
        self.objects = objects
        self.base = base
        self.build = build
        self.build_id = build_id

    @contextlib.contextmanager
    def folder(self) -> Iterator[str]:
        with tempfile.TemporaryDirectory(prefix="yogadl-plus-part-") as path:
            if self.build_id is not None:
                mark_build(path, self.build_id)
            yield path

    def deliver(self, folder: str, chunk: ChunkInfo) -> ChunkInfo:
        path = os.path.join(folder, chunk.file)
        self.objects.upload(f"{self.base}{self.build}/{chunk.file}", path)  # rides out outages
        # A task needs disk for one chunk at a time, not for its whole part.
        os.remove(path)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + STAMP_SUFFIX)
        return dataclasses.replace(chunk, file=f"{self.build}/{chunk.file}")

    def settle(self, chunks: Sequence[ChunkInfo]) -> None:
        folder = f"{self.base}{self.build}/"
        present = {key for key, _ in self.objects.keys(folder)}
        named = {self.base + c.file for c in chunks}
        missing = sorted(named - present)
        if missing:
            raise CacheCorrupted(
                f"{self.objects.url}/{missing[0]}: a build task reported this chunk, but it is "
                "not in the bucket"
            )
        for key in sorted(present - named):
            self.objects.delete(key)

    def abort(self) -> None:
        # One try each: the build failed (perhaps the store did); what stays is collected by
        # the next build.
        objects = self.objects.retrying(self.objects.retries.at_most(0.0))
        with contextlib.suppress(Exception):
            for key, _ in objects.keys(f"{self.base}{self.build}/"):
                objects.delete(key)
