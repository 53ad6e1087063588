"""The lock of one version in a local storage: an ``flock`` on its lock file
(``<root>/<dataset_id>/+lock.<version>``), which the version's removal may delete.

Deleting a lock file is safe only if every locker checks, once it holds the lock, that the file
it locked is still the one at the path: a process that waited on a file another process then
deleted holds a lock nobody else sees, and would build beside a newcomer holding the new file.
``version_lock`` checks, and locks again where the file changed; ``remove_lock`` deletes the
file (and the dataset's folder, if that is all it held) while its caller still holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

__all__ = ["remove_lock", "version_lock"]


@contextlib.contextmanager
def version_lock(path: str, *, wait: bool = True) -> Iterator[bool]:
    """Hold the lock at ``path`` for the block: yields True, or without ``wait`` False at once
    when another holds it (or its folder is gone: nothing to lock). Each call has its own file
    descriptor, so threads of one process exclude each other too."""
    fd = _locked(path, wait)
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)  # (releases the flock)


def remove_lock(path: str) -> None:
    """Delete the lock file at ``path``, which the caller holds, and its folder if that is left
    empty; a process waiting on the old file then locks a new one."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    with contextlib.suppress(OSError):  # (not empty: other versions, or a builder arriving)
        os.rmdir(os.path.dirname(path))


def _locked(path: str, wait: bool) -> int | None:
    """A file descriptor holding the flock of the file now at ``path``, or None (see above)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            if not wait:
                return None
            # (The dataset's folder went with its last version's removal: made again.)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            held = os.fstat(fd)
            now = os.stat(path)
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the file we waited on was removed: lock the one at the path now
