"""Files written whole or not at all, and their digests: the durable-file steps that the cache,
the storage and the Keras backups share."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid

from yogadl_plus.errors import unwritable

__all__ = ["file_sha256", "fsync_dir", "write_durably"]


def file_sha256(path: str, block: int = 1 << 22) -> str:
    """The SHA-256 of the file at ``path``, as hex, read in blocks of ``block`` bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def write_durably(path: str, data: bytes) -> None:
    """Replace ``path`` by ``data`` whole or not at all: temp file, fsync, rename, and the
    folder's entry made durable too."""
    temp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(temp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.remove(temp)
        if isinstance(exc, OSError):
            raise unwritable(path, exc) from exc
        raise
    fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(path: str) -> None:
    """Make the entries of folder ``path`` (a rename, a new file) survive a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
