"""Copying a published version from one storage to another (``yogadl-plus push`` and ``pull``).

The copy is an ordinary build of the target: its chunk files are placed in the target's staging
folder and published whole by ``get_or_build``, so readers of the target see either no version or
the whole one, and two copies of one version never race.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable

from yogadl_plus.cache.integrity import verify_and_stamp
from yogadl_plus.cache.manifest import Manifest
from yogadl_plus.dataref import DataRef
from yogadl_plus.errors import CacheCorrupted
from yogadl_plus.storage.base import OnTransfer, Storage
from yogadl_plus.storage.remote import RemoteStorage

__all__ = ["copy_version"]


def copy_version(
    source: Storage,
    target: Storage,
    dataset_id: str,
    version: str,
    *,
    overwrite: bool = False,
    progress: Callable[[int], object] | None = None,
    on_transfer: OnTransfer = None,
) -> DataRef:
    """The target's DataRef of (dataset_id, version), copied from ``source`` if it is missing
    there (or ``overwrite``); if it exists, it is returned as it is and the source is not read.

    Every chunk is checked against the source manifest's sha256 on the way, so a damaged copy
    is never spread: CacheCorrupted names the chunk and nothing is published. The new manifest
    equals the source's (fingerprint, creation time, library version, chunk ids) but for the
    build folder the chunk files are in, which is the target's own. A remote source is pulled
    into its local cache first (again, if that copy turns out damaged).
    ``progress(n)`` is called with each chunk's size in bytes once it is placed and checked,
    ``on_transfer(n)`` after each chunk a bucket uploads or downloads (from its threads).
    """

    def whole() -> DataRef:
        # Copied chunk by chunk from the local copy: pulled whole, even over the cache's limit.
        if isinstance(source, RemoteStorage):
            return source.fetch(dataset_id, version, on_demand=False, on_transfer=on_transfer)
        return source.fetch(dataset_id, version)

    def build(folder: str) -> Manifest:
        origin = whole()
        try:
            return _place_chunks(origin, folder, progress)
        except CacheCorrupted:
            if not isinstance(source, RemoteStorage):
                raise
        finally:
            origin.close()
        # A damaged local copy of a bucket's version: pull it again (downloads are checked).
        del origin  # let go of its pin, so that the copy can be dropped
        source.local_cache.remove(dataset_id, version)
        for entry in os.listdir(folder):
            os.remove(os.path.join(folder, entry))
        origin = whole()
        try:
            return _place_chunks(origin, folder, progress)
        finally:
            origin.close()

    return target.get_or_build(
        dataset_id, version, build, overwrite=overwrite, on_transfer=on_transfer
    )


def _place_chunks(
    origin: DataRef, folder: str, progress: Callable[[int], object] | None
) -> Manifest:
    """Link or copy ``origin``'s chunks into ``folder``, check them, write their manifest."""
    chunks = []
    for info in origin.manifest.chunks:
        # A remote manifest names "b-<build>/chunk-00000.mdb"; the target decides its own layout.
        name = os.path.basename(info.file)
        original = os.path.join(origin.directory, info.file)
        placed = os.path.join(folder, name)
        try:
            _link_or_copy(original, placed)
        except FileNotFoundError:
            raise CacheCorrupted(f"chunk {original} is missing") from None
        verify_and_stamp(placed, info, where=original)
        chunks.append(dataclasses.replace(info, file=name))
        if progress is not None:
            progress(info.bytes)
    manifest = dataclasses.replace(origin.manifest, chunks=chunks)
    manifest.write(folder)
    return manifest


def _link_or_copy(source: str, target: str) -> None:
    """A hard link costs no bytes and no time (chunks are never written once published); a
    copy where the two folders are on different filesystems or links are not supported."""
    try:
        os.link(source, target)
    except (FileExistsError, FileNotFoundError):
        raise
    except OSError:
        shutil.copyfile(source, target)
